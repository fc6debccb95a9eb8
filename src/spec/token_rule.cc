#include <algorithm>

#include <fmt/format.h>

#include <hkv/spec/token_rule.h>

namespace hkv {
namespace {

// Blocks overlapping the half-open position range [first, end).
int64_t BlocksSpanning(int64_t first, int64_t end, int64_t block_tokens) {
  if (end <= first) return 0;
  return (end + block_tokens - 1) / block_tokens - first / block_tokens;
}

}  // namespace

int64_t TokenRule::IdealTokens(int64_t tokens, int64_t encoder_tokens) const {
  switch (kind) {
    case TokenRuleKind::kAll:
      return tokens;
    case TokenRuleKind::kWindow:
      return std::min<int64_t>(tokens, int64_t{span} + sinks);
    case TokenRuleKind::kChunk:
      return tokens == 0 ? 0 : (tokens - 1) % span + 1;
    case TokenRuleKind::kEncoder:
      return encoder_tokens;
    case TokenRuleKind::kState:
    case TokenRuleKind::kNothing:
      return 0;
  }
  return 0;
}

int64_t TokenRule::BlocksHeld(int64_t tokens, int64_t encoder_tokens, int64_t block_tokens) const {
  switch (kind) {
    case TokenRuleKind::kAll:
      return BlocksSpanning(0, tokens, block_tokens);
    case TokenRuleKind::kWindow: {
      // Kept positions: the sinks [0, sink_end) and the window [first, tokens). Count the blocks of
      // their union: a block holding both a sink and a window token counts once.
      const int64_t first = std::max<int64_t>(0, tokens - span);
      const int64_t sink_end = std::min<int64_t>(sinks, first);
      const int64_t sink_blocks = BlocksSpanning(0, sink_end, block_tokens);
      const int64_t window_begin = first / block_tokens;
      const int64_t window_end = (tokens + block_tokens - 1) / block_tokens;
      const int64_t overlap =
          std::max<int64_t>(0, std::min(sink_blocks, window_end) - window_begin);
      return sink_blocks + (window_end - window_begin) - overlap;
    }
    case TokenRuleKind::kChunk: {
      if (tokens == 0) return 0;
      const int64_t chunk_first = (tokens - 1) / span * span;
      return BlocksSpanning(chunk_first, tokens, block_tokens);
    }
    case TokenRuleKind::kEncoder:
      return BlocksSpanning(0, encoder_tokens, block_tokens);
    case TokenRuleKind::kState:
      return 1;
    case TokenRuleKind::kNothing:
      return 0;
  }
  return 0;
}

std::string_view TokenRuleKindName(TokenRuleKind kind) {
  switch (kind) {
    case TokenRuleKind::kAll:
      return "all";
    case TokenRuleKind::kWindow:
      return "window";
    case TokenRuleKind::kChunk:
      return "chunk";
    case TokenRuleKind::kEncoder:
      return "encoder";
    case TokenRuleKind::kState:
      return "state";
    case TokenRuleKind::kNothing:
      return "nothing";
  }
  return "?";
}

Result<TokenRuleKind> ParseTokenRuleKind(std::string_view name) {
  for (TokenRuleKind k :
       {TokenRuleKind::kAll, TokenRuleKind::kWindow, TokenRuleKind::kChunk, TokenRuleKind::kEncoder,
        TokenRuleKind::kState, TokenRuleKind::kNothing}) {
    if (name == TokenRuleKindName(k)) return k;
  }
  return Status::InvalidArgument(
      fmt::format("token rule '{}': expected all, window, chunk, encoder, state or nothing", name));
}

std::string TokenRule::Describe() const {
  switch (kind) {
    case TokenRuleKind::kWindow:
      return sinks > 0 ? fmt::format("window {} + {} sinks", span, sinks)
                       : fmt::format("window {}", span);
    case TokenRuleKind::kChunk:
      return fmt::format("chunk {}", span);
    default:
      return std::string(TokenRuleKindName(kind));
  }
}

TokenRule TokenRuleOf(const LayerSpec& layer) {
  if (IsRecurrentKind(layer.kind)) return {TokenRuleKind::kState, 0, 0};
  if (!layer.owns_kv()) return {TokenRuleKind::kNothing, 0, 0};
  switch (layer.kind) {
    case LayerKind::kSlidingWindow:
      return {TokenRuleKind::kWindow, layer.window, layer.sink_tokens};
    case LayerKind::kChunkedLocal:
      return {TokenRuleKind::kChunk, layer.chunk, 0};
    case LayerKind::kCrossAttention:
      return {TokenRuleKind::kEncoder, 0, 0};
    default:
      return {TokenRuleKind::kAll, 0, 0};
  }
}

}  // namespace hkv
