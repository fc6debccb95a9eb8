// `hkv sparse-eval` in process: the model's attention geometry in, a table or JSON out, bad
// input refused with exit code 2 and the value named.
#include "sparse_eval_command.h"

#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace hkv::cli {
namespace {

struct Outcome {
  int code = 0;
  std::string out, err;
};

Outcome RunEval(const SparseEvalArgs& args) {
  std::ostringstream out, err;
  Outcome r;
  r.code = RunSparseEvalCommand(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// A short run, so each test takes a fraction of a second with a real model's geometry.
SparseEvalArgs Args(const std::string& model) {
  SparseEvalArgs a;
  a.config = std::string(HKV_MODELS_DIR) + "/" + model;
  a.options.prompt_len = 128;
  a.options.decode_steps = 8;
  a.options.chunk = 32;
  a.options.trials = 2;
  a.json = true;
  return a;
}

// Parses a command line the way the hkv binary does.
SparseEvalArgs Parse(std::vector<std::string> argv) {
  CLI::App app;
  SparseEvalArgs args;
  AddSparseEvalCommand(app, args);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them backwards
  app.parse(reversed);
  return args;
}

TEST(SparseEvalCommandTest, JsonReportsEveryPolicyAndBudgetWithTheModelsGeometry) {
  const Outcome r = RunEval(Args("meta-llama--Llama-3.1-8B"));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["layer"], 0);
  EXPECT_EQ(j["layer_kind"], "full_attention");
  EXPECT_EQ(j["geometry"]["kv_heads"], 8);
  EXPECT_EQ(j["geometry"]["query_heads_per_kv_head"], 4);
  EXPECT_EQ(j["geometry"]["head_dim"], 128);
  EXPECT_EQ(j["options"]["prompt_len"], 128);
  EXPECT_EQ(j["options"]["trials"], 2);
  EXPECT_EQ(j["needle_dense_top"], 2);
  ASSERT_EQ(j["results"].size(), 18u);  // six policies x the default 10%, 25%, 50%
  const std::vector<std::string> order = {"dense", "streaming_llm", "h2o",
                                          "tova",  "snapkv",        "knorm"};
  const std::vector<double> shares = {0.1, 0.25, 0.5};
  for (size_t i = 0; i < 18; ++i) {
    const nlohmann::json& e = j["results"][i];
    EXPECT_EQ(e["policy"], order[i / 3]);
    EXPECT_EQ(e["budget_kind"], "fraction");
    EXPECT_EQ(e["budget"].get<double>(), shares[i % 3]);
    for (const char* field : {"budget_tokens", "mean_cache_tokens", "needles_retrieved",
                              "needle_retrieval", "mass", "oracle_mass", "ratio", "min_ratio"}) {
      EXPECT_TRUE(e.contains(field)) << field;
    }
    EXPECT_LE(e["ratio"].get<double>(), 1 + 1e-12);
    EXPECT_LE(e["mass"].get<double>(), e["oracle_mass"].get<double>() + 1e-12);
  }
  EXPECT_EQ(j["results"][0]["ratio"], 1.0);  // dense
  EXPECT_EQ(j["results"][0]["needle_retrieval"], 1.0);
  EXPECT_EQ(j["results"][2]["budget_tokens"], 68);  // 50% of 136 tokens
}

TEST(SparseEvalCommandTest, MlaAndInterleavedModelsUseTheirFirstFullLayer) {
  const Outcome mla = RunEval(Args("deepseek-ai--DeepSeek-V2-Lite"));
  ASSERT_EQ(mla.code, 0) << mla.err;
  const nlohmann::json m = nlohmann::json::parse(mla.out);
  EXPECT_EQ(m["layer_kind"], "mla");
  EXPECT_EQ(m["geometry"]["kv_heads"], 1);  // one latent shared by every query head
  EXPECT_EQ(m["geometry"]["query_heads_per_kv_head"], 16);
  EXPECT_EQ(m["geometry"]["head_dim"], 576);  // kv_lora_rank 512 + rope 64
  SparseEvalArgs scout = Args("meta-llama--Llama-4-Scout-17B-16E-Instruct");
  scout.policies = {"tova"};
  const Outcome s = RunEval(scout);
  ASSERT_EQ(s.code, 0) << s.err;
  const nlohmann::json j = nlohmann::json::parse(s.out);
  EXPECT_EQ(j["layer"], 3);  // layers 0-2 are chunked local attention
  EXPECT_EQ(j["geometry"]["query_heads_per_kv_head"], 5);
}

TEST(SparseEvalCommandTest, PoliciesAndBudgetsAreReadFromTheCommandLine) {
  const SparseEvalArgs a =
      Parse({"sparse-eval", "model", "--policy", "h2o,snapkv", "--policy", "h2o", "--budget",
             "0.1,64", "--budget", "25%", "--trials", "3", "--sinks", "2", "--json"});
  EXPECT_EQ(a.policies, (std::vector<std::string>{"h2o", "snapkv", "h2o"}));
  EXPECT_EQ(a.budgets, (std::vector<std::string>{"0.1", "64", "25%"}));
  EXPECT_EQ(a.options.trials, 3);
  EXPECT_EQ(a.policy.sinks, 2);
  EXPECT_TRUE(a.json);
  SparseEvalArgs run = Args("meta-llama--Llama-3.1-8B");
  run.policies = a.policies;
  run.budgets = a.budgets;
  const Outcome r = RunEval(run);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 6u);  // h2o once, then snapkv, each under three budgets
  EXPECT_EQ(j["results"][0]["policy"], "h2o");
  EXPECT_EQ(j["results"][3]["policy"], "snapkv");
  EXPECT_EQ(j["results"][1]["budget_kind"], "tokens");
  EXPECT_EQ(j["results"][1]["budget"], 64);
  EXPECT_EQ(j["results"][1]["budget_tokens"], 64);
  EXPECT_EQ(j["results"][2]["budget"], 0.25);
}

TEST(SparseEvalCommandTest, TheTableHasARowPerPolicyAndBudgetAndIsDeterministic) {
  SparseEvalArgs a = Args("meta-llama--Llama-3.1-8B");
  a.json = false;
  a.policies = {"streaming_llm", "tova"};
  a.budgets = {"0.25", "16"};
  const Outcome r = RunEval(a);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("8 KV heads x 4 query heads, head_dim 128"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("policy"), std::string::npos);
  size_t rows = 0;
  for (size_t at = 0; (at = r.out.find("\nstreaming_llm ", at)) != std::string::npos; ++at)
    ++rows;
  for (size_t at = 0; (at = r.out.find("\ntova ", at)) != std::string::npos; ++at)
    ++rows;
  EXPECT_EQ(rows, 4u) << r.out;
  EXPECT_NE(r.out.find("25%"), std::string::npos);
  EXPECT_EQ(RunEval(a).out, r.out);  // the same seed, the same report
}

TEST(SparseEvalCommandTest, BadInputExitsTwoNamingTheValue) {
  const auto refused = [](SparseEvalArgs a, const std::string& what) {
    const Outcome r = RunEval(a);
    EXPECT_EQ(r.code, 2) << what;
    EXPECT_TRUE(r.out.empty()) << what;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  };
  const SparseEvalArgs ok = Args("meta-llama--Llama-3.1-8B");
  SparseEvalArgs a = ok;
  a.policies = {"lru"};
  refused(a, "--policy 'lru'");
  for (const char* bad : {"0", "1.5", "-4", "0%", "half"}) {
    a = ok;
    a.budgets = {"0.5", bad};
    refused(a, std::string("budget '") + bad + "'");
  }
  a = ok;
  a.options.trials = -3;
  refused(a, "--trials -3");
  a = ok;
  a.options.decode_steps = 0;
  refused(a, "--decode 0");
  a = ok;
  a.options.chunk = -1;
  refused(a, "--chunk -1");
  a = ok;
  a.options.prompt_len = 1;
  refused(a, "--prompt-len 1");
  a = ok;
  a.options.question_tokens = -2;
  refused(a, "--question-tokens -2");
  a = ok;
  a.options.question_tokens = 200;  // beyond the prompt
  refused(a, "question_tokens = 200");
  a = ok;
  a.policy.sinks = -1;
  refused(a, "--sinks -1");
  a = ok;
  a.policy.window = 0;
  refused(a, "--window 0");
  a = ok;
  a.config = "/nonexistent/config.json";
  refused(a, "/nonexistent/config.json");
  a = ok;
  a.config = std::string(HKV_TEST_DATA_DIR) + "/configs/mistral.json";  // sliding windows only
  refused(a, "no full-attention or MLA layer");
}

}  // namespace
}  // namespace hkv::cli
