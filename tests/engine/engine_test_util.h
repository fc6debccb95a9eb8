// Shared by the engine tests: every bundled model (the engine runs them all), and readable test
// names.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace hkv::testing {

// Under AddressSanitizer + UndefinedBehaviorSanitizer the engine runs ~8x slower; the randomised
// end-to-end tests then run fewer seeds (still until every feature they check has run) and the
// comparisons that need many seeds to be stable are left to the normal build.
#if HKV_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// "meta-llama--Llama-3.1-8B" -> "Llama_3_1_8B".
inline std::string ModelTestName(const ::testing::TestParamInfo<std::string>& p) {
  std::string n = p.param.substr(p.param.find("--") + 2);
  for (char& c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

inline const std::vector<std::string> kEngineModelNames = {
    "meta-llama--Llama-3.1-8B",
    "google--gemma-2-9b",
    "google--gemma-3-4b-it",
    "mistralai--Ministral-8B-Instruct-2410",
    "meta-llama--Llama-4-Scout-17B-16E-Instruct",
    "openai--gpt-oss-20b",
    "ai21labs--Jamba-v0.1",
    "ibm-ai-platform--Bamba-9B",
    "Qwen--Qwen3-Next-80B-A3B-Instruct",
    "deepseek-ai--DeepSeek-V2-Lite",
    "meta-llama--Llama-3.2-11B-Vision",
    "google--gemma-3n-E4B-it"};

inline const auto kEngineModels = ::testing::ValuesIn(kEngineModelNames);

// The model's place in kEngineModelNames: sanitizer runs spread variants (policies, say) over the
// models by it, so that every variant still runs on some models.
inline size_t EngineModelIndex(const std::string& name) {
  const auto it = std::find(kEngineModelNames.begin(), kEngineModelNames.end(), name);
  EXPECT_NE(it, kEngineModelNames.end()) << name;
  return static_cast<size_t>(it - kEngineModelNames.begin());
}

}  // namespace hkv::testing
