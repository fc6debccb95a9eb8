// Every class of bad config gets one message naming the file, the field, the value and what was
// expected.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "spec_test_util.h"

namespace hkv {
namespace {

constexpr std::string_view kLlama = R"({"model_type": "llama", "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})";

// Returns kLlama with `field` replaced by `value` (or removed when value is empty).
std::string LlamaWith(const std::string& field, const std::string& value) {
  std::string json(kLlama);
  const std::string key = "\"" + field + "\": ";
  const size_t at = json.find(key);
  const size_t end = json.find_first_of(",}", at + key.size());
  if (value.empty()) {
    const size_t comma = json.find(',', at);
    json.erase(at, comma + 1 - at);
  } else {
    json.replace(at + key.size(), end - at - key.size(), value);
  }
  return json;
}

void ExpectError(std::string_view json, StatusCode code,
                 std::initializer_list<std::string_view> fragments) {
  const Result<ModelSpec> r = ParseModelConfig(json, "bad/config.json");
  ASSERT_FALSE(r.ok()) << "expected an error for " << json;
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find("bad/config.json"), std::string::npos)
      << r.status().message();
  for (std::string_view f : fragments) {
    EXPECT_NE(r.status().message().find(f), std::string::npos)
        << "missing '" << f << "' in: " << r.status().message();
  }
}

TEST(ConfigErrorsTest, MissingField) {
  ExpectError(LlamaWith("num_hidden_layers", ""), StatusCode::kInvalidArgument,
              {"'num_hidden_layers' is missing", "expected a positive integer"});
}

TEST(ConfigErrorsTest, WrongType) {
  ExpectError(LlamaWith("num_attention_heads", "\"four\""), StatusCode::kInvalidArgument,
              {"'num_attention_heads' = \"four\"", "expected a positive integer"});
  ExpectError(LlamaWith("num_hidden_layers", "2.5"), StatusCode::kInvalidArgument,
              {"'num_hidden_layers' = 2.5"});
  ExpectError(R"({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "use_sliding_window": "yes"})",
              StatusCode::kInvalidArgument, {"'use_sliding_window' = \"yes\"", "true or false"});
}

TEST(ConfigErrorsTest, NegativeOrZeroSizes) {
  ExpectError(LlamaWith("hidden_size", "0"), StatusCode::kInvalidArgument,
              {"'hidden_size' = 0", "positive integer"});
  ExpectError(LlamaWith("num_key_value_heads", "-2"), StatusCode::kInvalidArgument,
              {"'num_key_value_heads' = -2"});
}

TEST(ConfigErrorsTest, HeadsNotDividing) {
  ExpectError(LlamaWith("num_key_value_heads", "3"), StatusCode::kInvalidArgument,
              {"'num_key_value_heads' = 3", "a divisor of num_attention_heads = 4"});
  // No head_dim and a hidden size the heads do not divide.
  ExpectError(LlamaWith("hidden_size", "66"), StatusCode::kInvalidArgument,
              {"'num_attention_heads' = 4", "derive the absent head_dim"});
  ExpectError(R"({"model_type": "bamba", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "attn_layer_indices": [], "mamba_n_heads": 6, "mamba_d_head": 16,
      "mamba_n_groups": 1, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2})",
              StatusCode::kInvalidArgument, {"'mamba_n_heads' = 6", "inner width 128"});
}

TEST(ConfigErrorsTest, UnknownModelTypeWithoutLayerTypes) {
  ExpectError(LlamaWith("model_type", "\"frobnicator\""), StatusCode::kUnsupported,
              {"model_type = \"frobnicator\"", "layer_types", "gemma2"});
  ExpectError(R"({"hidden_size": 64, "num_hidden_layers": 1})", StatusCode::kInvalidArgument,
              {"'model_type' is missing"});
}

TEST(ConfigErrorsTest, LayerListLengthMismatch) {
  ExpectError(R"({"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 3,
      "num_attention_heads": 4, "sliding_window": 8,
      "layer_types": ["sliding_attention", "full_attention"]})",
              StatusCode::kInvalidArgument,
              {"'layer_types' = [\"sliding_attention\",\"full_attention\"]",
               "num_hidden_layers = 3 entries (found 2)"});
  ExpectError(R"({"model_type": "nemotron_h", "hidden_size": 64, "num_hidden_layers": 3,
      "num_attention_heads": 4, "hybrid_override_pattern": "M*"})",
              StatusCode::kInvalidArgument, {"'hybrid_override_pattern' = \"M*\""});
  ExpectError(R"({"model_type": "x", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "layer_types": ["warp_attention"]})",
              StatusCode::kInvalidArgument, {"'layer_types[0]' = \"warp_attention\""});
  ExpectError(R"({"model_type": "mllama", "text_config": {"hidden_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, "cross_attention_layers": [1, 9]}})",
              StatusCode::kInvalidArgument,
              {"'text_config.cross_attention_layers' = [1,9]", "below num_hidden_layers = 4"});
}

TEST(ConfigErrorsTest, MissingPatternFieldForTheLayersThatNeedIt) {
  ExpectError(R"({"model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4})",
              StatusCode::kInvalidArgument, {"'sliding_window' is missing"});
  ExpectError(R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "qk_rope_head_dim": 64})",
              StatusCode::kInvalidArgument, {"'kv_lora_rank' is missing"});
}

TEST(ConfigErrorsTest, AbsurdSizesAreRejectedBeforeTheyAllocateOrOverflow) {
  ExpectError(LlamaWith("num_hidden_layers", "1000000000"), StatusCode::kInvalidArgument,
              {"'num_hidden_layers' = 1000000000", "at most 65536 layers"});
  ExpectError(LlamaWith("num_hidden_layers", "99999999999"), StatusCode::kInvalidArgument,
              {"'num_hidden_layers' = 99999999999", "positive integer"});
  ExpectError(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2000000000})",
              StatusCode::kInvalidArgument, {"head_dim_k = 2000000000", "at most 2^20"});
  ExpectError(R"({"model_type": "jamba", "hidden_size": 2000000000, "num_hidden_layers": 1,
      "num_attention_heads": 4, "attn_layer_offset": 1, "mamba_expand": 2})",
              StatusCode::kInvalidArgument, {"Mamba inner width that fits in int32"});
  ExpectError(R"({"model_type": "jamba", "hidden_size": 1000000, "num_hidden_layers": 1,
      "num_attention_heads": 4, "attn_layer_offset": 1, "mamba_expand": 2000,
      "mamba_d_state": 1000000})",
              StatusCode::kInvalidArgument, {"recurrent state is", "expected at most"});
}

TEST(ConfigErrorsTest, InvalidJson) {
  ExpectError(R"({"model_type": "llama", "hidden_size": )", StatusCode::kParseError,
              {"invalid JSON at byte"});
  ExpectError("[1, 2]", StatusCode::kInvalidArgument, {"expected a JSON object"});
  // A number too large for any numeric type is a JSON error, not an exception.
  ExpectError(R"({"hidden_size": 8888.8e82888888888})", StatusCode::kParseError, {"invalid JSON"});
}

TEST(ConfigErrorsTest, MissingAndUnreadableFiles) {
  const Result<ModelSpec> missing = LoadModelConfig("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model: no such file"), std::string::npos);

  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "hkv_unreadable";
  std::filesystem::create_directories(dir / "config.json");  // a folder where a file should be
  const Result<ModelSpec> unreadable = LoadModelConfig(dir);
  ASSERT_FALSE(unreadable.ok());
  EXPECT_EQ(unreadable.status().code(), StatusCode::kIoError);
  EXPECT_NE(unreadable.status().message().find("config.json: not a regular file"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hkv
