#include "resolve_options.h"

#include <algorithm>

#include <fmt/format.h>

namespace hkv {

Result<PlanOptions> ResolveOptions(const ModelSpec& model, const PlanOptions& options,
                                   std::vector<std::string>& warnings) {
  PlanOptions r = options;
  if (r.block_tokens < 1 || r.block_tokens > kMaxBlockTokens) {
    return Status::InvalidArgument(
        fmt::format("block_tokens = {}: expected tokens per block in [1, {}]", r.block_tokens,
                    kMaxBlockTokens));
  }
  if (r.memory_bytes <= 0) {
    return Status::InvalidArgument(
        fmt::format("memory_bytes = {}: expected a positive memory budget", r.memory_bytes));
  }

  if (r.max_model_len < 0 || r.max_model_len > kMaxTokens) {
    return Status::InvalidArgument(
        fmt::format("max_model_len = {}: expected 0 (the config's max_position_embeddings) or a "
                    "context length in [1, {}]",
                    r.max_model_len, kMaxTokens));
  }
  if (r.max_model_len == 0) {
    if (model.max_position_embeddings <= 0) {
      return Status::InvalidArgument(
          fmt::format("max_model_len is unset and {} gives no max_position_embeddings: pass the "
                      "context length with --max-model-len",
                      model.source));
    }
    r.max_model_len = std::min(model.max_position_embeddings, kMaxTokens);
  } else if (model.max_position_embeddings > 0 && r.max_model_len > model.max_position_embeddings) {
    // Legitimate (e.g. Ministral's 128K native context beyond its HF config), so only a warning.
    warnings.push_back(
        fmt::format("max_model_len = {} exceeds the config's max_position_embeddings = {}",
                    r.max_model_len, model.max_position_embeddings));
  }

  if (r.seq_tokens < 0 || r.seq_tokens > r.max_model_len) {
    return Status::InvalidArgument(
        fmt::format("seq_tokens = {}: expected 0 (max_model_len) or decoder tokens in [1, "
                    "max_model_len = {}]",
                    r.seq_tokens, r.max_model_len));
  }
  if (r.seq_tokens == 0) r.seq_tokens = r.max_model_len;

  const bool cross = model.has_cross_attention();
  if (r.encoder_tokens < -1 || r.encoder_tokens > kMaxTokens) {
    return Status::InvalidArgument(
        fmt::format("encoder_tokens = {}: expected -1 (the model's largest encoder input) or a "
                    "count in [0, {}]",
                    r.encoder_tokens, kMaxTokens));
  }
  if (r.encoder_tokens == -1) {
    r.encoder_tokens = cross ? std::min(model.max_encoder_tokens, kMaxTokens) : 0;
  } else if (r.encoder_tokens > 0 && !cross) {
    return Status::InvalidArgument(
        fmt::format("encoder_tokens = {}: {} has no cross-attention layers, so expected 0",
                    r.encoder_tokens, model.source));
  }
  return r;
}

}  // namespace hkv
