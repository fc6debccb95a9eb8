#include "grouping.h"

namespace hkv {

int64_t PageBytesOf(const ModelSpec& model, const std::vector<int32_t>& layers,
                    int32_t block_tokens) {
  int64_t bytes = 0;
  for (int32_t i : layers) {
    const LayerSpec& l = model.layers[static_cast<size_t>(i)];
    bytes += l.owns_state() ? l.state_bytes() : int64_t{block_tokens} * l.kv_bytes_per_token();
  }
  return bytes;
}

std::vector<KvGroup> FormGroups(const ModelSpec& model, int32_t block_tokens,
                                int64_t max_model_len) {
  std::vector<KvGroup> groups;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    TokenRule rule = TokenRuleOf(model.layers[i]);
    // A separate group would cost a block table, its own blocks and every per-group step of the
    // manager for the same tokens full attention keeps.
    if ((rule.kind == TokenRuleKind::kWindow || rule.kind == TokenRuleKind::kChunk) &&
        rule.span >= max_model_len) {
      rule = {TokenRuleKind::kAll, 0, 0};
    }
    if (rule.kind == TokenRuleKind::kNothing) continue;
    // Models have a handful of distinct rules, so a linear search beats any map.
    KvGroup* group = nullptr;
    for (KvGroup& g : groups) {
      if (g.rule == rule) group = &g;
    }
    if (group == nullptr) {
      group = &groups.emplace_back();
      group->id = static_cast<int32_t>(groups.size() - 1);
      group->rule = rule;
      group->block_tokens = rule.kind == TokenRuleKind::kState ? 0 : block_tokens;
    }
    group->layers.push_back(static_cast<int32_t>(i));
  }
  for (KvGroup& g : groups)
    g.page_bytes = PageBytesOf(model, g.layers, block_tokens);
  return groups;
}

}  // namespace hkv
