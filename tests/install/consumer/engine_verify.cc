// Runs the installed reference engine over a few requests of a scaled-down bundled model (Bamba:
// Mamba-2 + attention) and requires generation through the managed cache to equal the dense
// reference.
#include <cstdio>

#include <hkv/engine/verify.h>
#include <hkv/spec/config_loader.h>

int main() {
  auto model = hkv::LoadModelConfig(MODELS_DIR "/ibm-ai-platform--Bamba-9B");
  if (!model.ok()) {
    std::fprintf(stderr, "load: %s\n", model.status().ToString().c_str());
    return 1;
  }
  hkv::VerifyOptions options;
  options.requests = 6;
  auto report = hkv::RunVerify(*model, options);
  if (!report.ok()) {
    std::fprintf(stderr, "verify: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::printf("%s: %lld requests, %lld steps, %lld mismatches, max logit diff %g\n",
              report->model.c_str(), static_cast<long long>(report->requests),
              static_cast<long long>(report->steps), static_cast<long long>(report->mismatches),
              static_cast<double>(report->max_logit_diff));
  return report->completed && report->mismatches == 0 && report->max_logit_diff <= 1e-4f ? 0 : 1;
}
