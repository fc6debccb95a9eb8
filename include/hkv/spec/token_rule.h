// TokenRule: which tokens of a sequence a layer must keep, as a value that can be compared.
//
// Contract: two layers with equal TokenRules keep exactly the same token positions for every
// sequence, so they can share one block table. The counting functions answer "how many tokens
// must be resident to compute the last of `tokens` decoder tokens" (ideal) and "how many blocks of
// `block_tokens` hold them" (what a block-granular manager that frees blocks as soon as they are
// no longer needed keeps). Encoder tokens only count for kEncoder rules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <hkv/common/result.h>
#include <hkv/spec/layer_spec.h>

namespace hkv {

enum class TokenRuleKind : unsigned char {
  kAll,      // every decoder token (full attention, MLA)
  kWindow,   // the last `span` tokens plus the first `sinks`
  kChunk,    // the tokens of the current chunk of `span`
  kEncoder,  // every encoder token, none of the decoder's
  kState,    // one fixed-size state per sequence, no tokens
  kNothing,  // owns nothing (MLP layers, KV-shared layers)
};

struct TokenRule {
  TokenRuleKind kind = TokenRuleKind::kNothing;
  int32_t span = 0;
  int32_t sinks = 0;

  bool operator==(const TokenRule&) const = default;
  bool keeps_tokens() const {
    return kind != TokenRuleKind::kState && kind != TokenRuleKind::kNothing;
  }

  int64_t IdealTokens(int64_t tokens, int64_t encoder_tokens) const;
  int64_t BlocksHeld(int64_t tokens, int64_t encoder_tokens, int64_t block_tokens) const;
  // Short human form: "all", "window 4096", "window 128 + 4 sinks", "chunk 8192", "encoder",
  // "state", "nothing".
  std::string Describe() const;
};

TokenRule TokenRuleOf(const LayerSpec& layer);

// "all", "window", "chunk", "encoder", "state", "nothing"; Parse accepts exactly those and names
// the text it refuses.
std::string_view TokenRuleKindName(TokenRuleKind kind);
Result<TokenRuleKind> ParseTokenRuleKind(std::string_view name);

}  // namespace hkv
