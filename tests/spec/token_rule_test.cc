#include <gtest/gtest.h>

#include <hkv/spec/token_rule.h>

namespace hkv {
namespace {

constexpr int64_t kBlock = 16;

TEST(TokenRuleTest, AllKeepsEveryDecoderToken) {
  const TokenRule all{TokenRuleKind::kAll, 0, 0};
  EXPECT_EQ(all.IdealTokens(100, 50), 100);
  EXPECT_EQ(all.BlocksHeld(0, 0, kBlock), 0);
  EXPECT_EQ(all.BlocksHeld(1, 0, kBlock), 1);
  EXPECT_EQ(all.BlocksHeld(16, 0, kBlock), 1);
  EXPECT_EQ(all.BlocksHeld(17, 0, kBlock), 2);
}

TEST(TokenRuleTest, WindowHoldsOnlyTheBlocksOfTheLastWindow) {
  const TokenRule w{TokenRuleKind::kWindow, 32, 0};
  EXPECT_EQ(w.IdealTokens(10, 0), 10);
  EXPECT_EQ(w.IdealTokens(1000, 0), 32);
  // 32 tokens ending at a block boundary: exactly two blocks.
  EXPECT_EQ(w.BlocksHeld(64, 0, kBlock), 2);
  // Ending mid-block: positions 33..64 span blocks 2, 3 and 4.
  EXPECT_EQ(w.BlocksHeld(65, 0, kBlock), 3);
  EXPECT_EQ(w.BlocksHeld(20, 0, kBlock), 2);
}

TEST(TokenRuleTest, WindowWithSinksKeepsTheFirstTokensToo) {
  const TokenRule w{TokenRuleKind::kWindow, 32, 4};
  EXPECT_EQ(w.IdealTokens(1000, 0), 36);
  EXPECT_EQ(w.IdealTokens(30, 0), 30);
  // Sinks in block 0, window [968, 1000) in blocks 60..62.
  EXPECT_EQ(w.BlocksHeld(1000, 0, kBlock), 1 + 3);
  // Window reaches back into the sink block: counted once.
  EXPECT_EQ(w.BlocksHeld(40, 0, kBlock), 3);
  EXPECT_EQ(w.Describe(), "window 32 + 4 sinks");
}

TEST(TokenRuleTest, KindNamesRoundTripAndUnknownNamesAreRefused) {
  for (TokenRuleKind k :
       {TokenRuleKind::kAll, TokenRuleKind::kWindow, TokenRuleKind::kChunk, TokenRuleKind::kEncoder,
        TokenRuleKind::kState, TokenRuleKind::kNothing}) {
    EXPECT_EQ(ParseTokenRuleKind(TokenRuleKindName(k)).value(), k);
  }
  EXPECT_EQ((TokenRule{TokenRuleKind::kState, 0, 0}).Describe(), "state");
  const auto bad = ParseTokenRuleKind("sideways");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'sideways'"), std::string::npos);
}

TEST(TokenRuleTest, ChunkHoldsTheCurrentChunkOnly) {
  const TokenRule c{TokenRuleKind::kChunk, 64, 0};
  EXPECT_EQ(c.IdealTokens(64, 0), 64);
  EXPECT_EQ(c.IdealTokens(65, 0), 1);
  EXPECT_EQ(c.IdealTokens(130, 0), 2);
  EXPECT_EQ(c.BlocksHeld(64, 0, kBlock), 4);
  EXPECT_EQ(c.BlocksHeld(65, 0, kBlock), 1);
  // A chunk that does not start on a block boundary shares its first block with the last chunk.
  EXPECT_EQ(TokenRule(TokenRuleKind::kChunk, 24, 0).BlocksHeld(30, 0, kBlock), 1);
  EXPECT_EQ(TokenRule(TokenRuleKind::kChunk, 24, 0).BlocksHeld(40, 0, kBlock), 2);
}

TEST(TokenRuleTest, EncoderCountsEncoderTokensOnly) {
  const TokenRule e{TokenRuleKind::kEncoder, 0, 0};
  EXPECT_EQ(e.IdealTokens(43, 6404), 6404);
  EXPECT_EQ(e.BlocksHeld(43, 6404, kBlock), 401);
  EXPECT_EQ(e.BlocksHeld(43, 0, kBlock), 0);
}

TEST(TokenRuleTest, StateIsOnePageAndNothingIsNone) {
  EXPECT_EQ(TokenRule(TokenRuleKind::kState, 0, 0).BlocksHeld(99999, 0, kBlock), 1);
  EXPECT_EQ(TokenRule(TokenRuleKind::kState, 0, 0).IdealTokens(99999, 0), 0);
  EXPECT_EQ(TokenRule(TokenRuleKind::kNothing, 0, 0).BlocksHeld(99999, 0, kBlock), 0);
}

TEST(TokenRuleTest, RulesOfLayers) {
  LayerSpec l;
  l.num_kv_heads = 1;
  l.head_dim_k = l.head_dim_v = 8;
  l.kind = LayerKind::kSlidingWindow;
  l.window = 128;
  EXPECT_EQ(TokenRuleOf(l), (TokenRule{TokenRuleKind::kWindow, 128, 0}));
  l.kind = LayerKind::kMla;
  EXPECT_EQ(TokenRuleOf(l).kind, TokenRuleKind::kAll);
  l.kind = LayerKind::kFullAttention;
  l.kv_source_layer = 0;  // shared: owns nothing
  EXPECT_EQ(TokenRuleOf(l).kind, TokenRuleKind::kNothing);
  l.kind = LayerKind::kMamba2;
  l.kv_source_layer = -1;
  EXPECT_EQ(TokenRuleOf(l).kind, TokenRuleKind::kState);
}

}  // namespace
}  // namespace hkv
