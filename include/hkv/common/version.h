// Version: the one version string of hybridkv.
//
// Contract: Version() returns "MAJOR.MINOR.PATCH" as the top-level CMakeLists.txt's project()
// declares it - the only place the version is written. The `hkv --version` flag and the Python
// module's __version__ report this same string.
#pragma once

#include <string_view>

namespace hkv {

std::string_view Version();

}  // namespace hkv
