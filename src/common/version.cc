#include <hkv/common/version.h>

namespace hkv {

// HKV_VERSION comes from project(VERSION) in the top-level CMakeLists.txt.
std::string_view Version() {
  return HKV_VERSION;
}

}  // namespace hkv
