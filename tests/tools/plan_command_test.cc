// `hkv plan` end to end, in process: options in, JSON/table out, errors as exit codes.
#include "plan_command.h"

#include <filesystem>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace hkv::cli {
namespace {

struct Outcome {
  int code = 0;
  std::string out, err;
};

Outcome RunPlan(PlanArgs args) {
  std::ostringstream out, err;
  Outcome r;
  r.code = RunPlanCommand(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

PlanArgs Args(const std::string& model) {
  PlanArgs a;
  a.config = std::string(HKV_MODELS_DIR) + "/" + model;
  a.json = true;
  return a;
}

nlohmann::json Json(const Outcome& r) {
  EXPECT_EQ(r.code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(PlanCommandTest, JsonHasTheDocumentedFields) {
  const nlohmann::json j = Json(RunPlan(Args("ibm-ai-platform--Bamba-9B")));
  for (const char* key : {"model_type", "num_layers", "layers", "groups", "num_blocks",
                          "bytes_per_token_full", "state_bytes_per_sequence", "sequence",
                          "max_sequences", "page_classes", "layout", "candidates"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["model_type"], "bamba");
  EXPECT_EQ(j["num_layers"], 32);
  EXPECT_EQ(j["layers"][9], "full_attention");
  EXPECT_EQ(j["layers"][0], "mamba2");
  EXPECT_EQ(j["bytes_per_token_full"], 3 * 4096);
  EXPECT_EQ(j["state_bytes_per_sequence"], 29 * 2147840);
  for (const char* key : {"tokens", "encoder_tokens", "ideal_bytes", "hybridkv_bytes",
                          "uniform_bytes", "hybridkv_waste", "uniform_waste"}) {
    EXPECT_TRUE(j["sequence"].contains(key)) << key;
  }
  for (const nlohmann::json& g : j["groups"]) {
    for (const char* key : {"kind", "layers", "block_tokens", "page_bytes"}) {
      EXPECT_TRUE(g.contains(key)) << key;
    }
  }
  EXPECT_GT(j["max_sequences"]["hybridkv"].get<int64_t>(), 0);
}

TEST(PlanCommandTest, RfcUniformWasteFigures) {
  PlanArgs gemma = Args("google--gemma-2-9b");
  gemma.seq_len = 8192;
  const nlohmann::json g = Json(RunPlan(gemma));
  EXPECT_DOUBLE_EQ(g["sequence"]["uniform_waste"].get<double>(), 0.25);
  EXPECT_LT(g["sequence"]["hybridkv_waste"].get<double>(), 0.01);

  PlanArgs ministral = Args("mistralai--Ministral-8B-Instruct-2410");
  ministral.max_model_len = 131072;
  const Outcome mr = RunPlan(ministral);
  const nlohmann::json m = Json(mr);
  EXPECT_EQ(m["sequence"]["tokens"], 131072);
  EXPECT_DOUBLE_EQ(m["sequence"]["uniform_waste"].get<double>(), 0.5625);
  EXPECT_LT(m["sequence"]["hybridkv_waste"].get<double>(), 0.01);
  // Planning past the config's own maximum is a warning, not an error.
  EXPECT_NE(mr.err.find("warning"), std::string::npos);
  EXPECT_NE(mr.err.find("131072"), std::string::npos);

  PlanArgs mllama = Args("meta-llama--Llama-3.2-11B-Vision");
  mllama.seq_len = 43;
  mllama.encoder_tokens = 6404;
  const nlohmann::json v = Json(RunPlan(mllama));
  EXPECT_NEAR(v["sequence"]["uniform_waste"].get<double>(), 0.796, 0.0005);
  EXPECT_LT(v["sequence"]["hybridkv_waste"].get<double>(), 0.01);
}

TEST(PlanCommandTest, TableNamesTheModelAndTheComparison) {
  PlanArgs a = Args("google--gemma-2-9b");
  a.json = false;
  a.show_layout = true;
  const Outcome r = RunPlan(a);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("gemma2"), std::string::npos);
  EXPECT_NE(r.out.find("uniform"), std::string::npos);
  EXPECT_NE(r.out.find("hybridkv"), std::string::npos);
  EXPECT_NE(r.out.find("Layout"), std::string::npos);
}

TEST(PlanCommandTest, BadOptionsExitOneWithAMessageNamingThem) {
  struct Case {
    void (*mutate)(PlanArgs&);
    const char* fragment;
  };
  const Case cases[] = {
      {[](PlanArgs& a) { a.memory = "lots"; }, "--memory"},
      {[](PlanArgs& a) { a.kv_dtype = "int4"; }, "--kv-dtype"},
      {[](PlanArgs& a) { a.state_dtype = "int4"; }, "--state-dtype"},
      {[](PlanArgs& a) { a.block_tokens = 0; }, "--block-tokens"},
      {[](PlanArgs& a) { a.layout = "diagonal"; }, "--layout"},
      {[](PlanArgs& a) { a.strategy = "best"; }, "--strategy"},
      {[](PlanArgs& a) { a.config = "/no/such/model"; }, "/no/such/model"},
      {[](PlanArgs& a) { a.memory = "1MiB"; }, "memory"},
  };
  for (const Case& c : cases) {
    PlanArgs a = Args("google--gemma-2-9b");
    c.mutate(a);
    const Outcome r = RunPlan(a);
    EXPECT_EQ(r.code, 1) << c.fragment;
    EXPECT_TRUE(r.out.empty()) << c.fragment;
    EXPECT_NE(r.err.find(c.fragment), std::string::npos) << r.err;
  }
}

TEST(PlanCommandTest, EveryBundledModelPlans) {
  for (const char* model :
       {"Qwen--Qwen3-Next-80B-A3B-Instruct", "ai21labs--Jamba-v0.1",
        "deepseek-ai--DeepSeek-V2-Lite", "google--gemma-2-9b", "google--gemma-3-4b-it",
        "google--gemma-3n-E4B-it", "ibm-ai-platform--Bamba-9B", "meta-llama--Llama-3.1-8B",
        "meta-llama--Llama-3.2-11B-Vision", "meta-llama--Llama-4-Scout-17B-16E-Instruct",
        "mistralai--Ministral-8B-Instruct-2410", "openai--gpt-oss-20b"}) {
    PlanArgs a = Args(model);
    a.seq_len = 4096;
    a.max_model_len = 4096;
    const Outcome r = RunPlan(a);
    EXPECT_EQ(r.code, 0) << model << ": " << r.err;
  }
}

TEST(PlanCommandTest, EveryFamilyFixturePlans) {
  int planned = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(HKV_TEST_DATA_DIR) + "/configs")) {
    PlanArgs a;
    a.config = entry.path().string();
    a.json = true;
    a.seq_len = 2048;
    a.max_model_len = 4096;
    const nlohmann::json j = Json(RunPlan(a));
    EXPECT_GT(j["max_sequences"]["hybridkv"].get<int64_t>(), 0) << a.config;
    EXPECT_LT(j["sequence"]["hybridkv_waste"].get<double>(), 0.01) << a.config;
    ++planned;
  }
  EXPECT_GE(planned, 9);
}

}  // namespace
}  // namespace hkv::cli
