// libFuzzer target: any bytes into the trace reader. An accepted trace must write back to bytes
// that read back equal (the canonical form is a fixed point).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include <hkv/sim/trace.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  hkv::Result<hkv::Trace> trace = hkv::ParseTrace(text, "fuzz.jsonl");
  if (!trace.ok()) return 0;
  std::ostringstream out;
  hkv::WriteTrace(*trace, out);
  hkv::Result<hkv::Trace> again = hkv::ParseTrace(out.str(), "rewritten.jsonl");
  if (!again.ok() || !(*again == *trace)) {
    std::fprintf(stderr, "trace_fuzz: a written trace does not read back equal\n");
    std::abort();
  }
  return 0;
}
