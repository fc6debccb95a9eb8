// ModelIdentity: a pure function of what decides a block's bytes - each input changes it, the
// spec's file name and the order of weight files do not - and its hex form round-trips.
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include <hkv/connector/model_identity.h>
#include <hkv/spec/config_loader.h>

#include "tier_test_util.h"

namespace hkv {
namespace {

ModelSpec Load(const std::string& name) {
  return LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name + "/config.json").value();
}

ModelIdentity Of(const ModelSpec& spec, const ModelIdentitySources& s) {
  Result<ModelIdentity> id = ComputeModelIdentity(spec, s);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  return id.ok() ? *id : ModelIdentity{};
}

TEST(ModelIdentityTest, EveryInputCountsAndNothingElse) {
  const ModelSpec bamba = Load("ibm-ai-platform--Bamba-9B");
  ModelIdentitySources base;
  base.weights_id = "ibm/bamba-9b@abc123";
  base.block_tokens = 16;
  const ModelIdentity id = Of(bamba, base);
  EXPECT_EQ(Of(bamba, base), id);  // deterministic

  ModelSpec relabelled = bamba;
  relabelled.source = "/elsewhere/config.json";
  relabelled.warnings.push_back("a note");
  EXPECT_EQ(Of(relabelled, base), id);

  ModelIdentitySources s = base;
  s.weights_id = "ibm/bamba-9b-instruct@abc123";
  EXPECT_NE(Of(bamba, s), id);
  s = base;
  s.salt = "tokenizer v2";
  EXPECT_NE(Of(bamba, s), id);
  s = base;
  s.block_tokens = 32;
  EXPECT_NE(Of(bamba, s), id);

  ModelSpec fp32 = bamba;
  for (LayerSpec& l : fp32.layers) {
    if (l.owns_kv()) {
      l.kv_dtype = DType::kFP32;
      break;
    }
  }
  EXPECT_NE(Of(fp32, base), id);
  ModelSpec wider = bamba;
  for (LayerSpec& l : wider.layers) {
    if (l.owns_kv()) {
      ++l.num_kv_heads;
      break;
    }
  }
  EXPECT_NE(Of(wider, base), id);
  EXPECT_NE(Of(Load("ai21labs--Jamba-v0.1"), base), id);
}

TEST(ModelIdentityTest, WeightFilesAreHashedByContentInAnyOrder) {
  testing::ScopedTempDir tmp;
  std::filesystem::create_directories(tmp.path());
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(tmp.path() / name, std::ios::binary) << text;
    return tmp.path() / name;
  };
  const ModelSpec spec = Load("meta-llama--Llama-3.1-8B");
  ModelIdentitySources s;
  s.weight_files = {write("a.safetensors", "weights one"), write("b.safetensors", "weights two")};
  const ModelIdentity id = Of(spec, s);
  std::swap(s.weight_files[0], s.weight_files[1]);
  EXPECT_EQ(Of(spec, s), id);
  write("b.safetensors", "weights 2wo");  // one byte changed
  EXPECT_NE(Of(spec, s), id);
  s.weight_files.push_back(tmp.path() / "missing.safetensors");
  const Result<ModelIdentity> missing = ComputeModelIdentity(spec, s);
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_NE(missing.status().message().find("missing.safetensors"), std::string::npos);
}

TEST(ModelIdentityTest, UnnamedWeightsAndBadHexAreRefused) {
  const ModelSpec spec = Load("meta-llama--Llama-3.1-8B");
  const Result<ModelIdentity> none = ComputeModelIdentity(spec, {});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("name the weights"), std::string::npos);
  ModelIdentitySources s;
  s.weights_id = "x";
  s.block_tokens = -1;
  EXPECT_EQ(ComputeModelIdentity(spec, s).status().code(), StatusCode::kInvalidArgument);

  const ModelIdentity id{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(id.Hex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(ModelIdentity::FromHex(id.Hex()).value(), id);
  for (const char* bad :
       {"", "0123", "0123456789ABCDEFfedcba9876543210", "0123456789abcdeffedcba987654321g",
        "0123456789abcdeffedcba98765432100"}) {
    EXPECT_EQ(ModelIdentity::FromHex(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace hkv
