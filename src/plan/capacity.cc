#include "capacity.h"

#include <algorithm>
#include <limits>

#include <hkv/common/byte_size.h>

namespace hkv {
namespace {

bool HasKvLayer(const ModelSpec& model) {
  return std::any_of(model.layers.begin(), model.layers.end(),
                     [](const LayerSpec& l) { return l.owns_kv(); });
}

double WasteOf(int64_t allocated, int64_t ideal) {
  if (allocated <= 0) return 0.0;
  return static_cast<double>(allocated - ideal) / static_cast<double>(allocated);
}

}  // namespace

int64_t PagesNeeded(const KvGroup& g, int64_t tokens, int64_t encoder_tokens) {
  return g.rule.BlocksHeld(tokens, encoder_tokens, std::max(g.block_tokens, 1));
}

std::vector<int64_t> ClassDemand(const std::vector<KvGroup>& groups, size_t num_classes,
                                 int64_t tokens, int64_t encoder_tokens) {
  std::vector<int64_t> need(num_classes, 0);
  for (const KvGroup& g : groups) {
    need[static_cast<size_t>(g.page_class)] += PagesNeeded(g, tokens, encoder_tokens);
  }
  return need;
}

int64_t UniformBytesPerToken(const ModelSpec& model) {
  int64_t total = 0;
  int64_t first_kv = 0;
  int64_t recurrent = 0;
  for (const LayerSpec& l : model.layers) {
    if (l.owns_kv()) {
      if (first_kv == 0) first_kv = l.kv_bytes_per_token();
      total += l.kv_bytes_per_token();
    }
    if (l.owns_state()) ++recurrent;
  }
  return total + recurrent * first_kv;
}

int64_t IdealBytes(const ModelSpec& model, int64_t tokens, int64_t encoder_tokens) {
  tokens = std::max<int64_t>(tokens, 0);
  encoder_tokens = std::max<int64_t>(encoder_tokens, 0);
  int64_t ideal = model.state_bytes_per_sequence();
  for (const LayerSpec& l : model.layers) {
    ideal += l.kv_bytes_per_token() * TokenRuleOf(l).IdealTokens(tokens, encoder_tokens);
  }
  return ideal;
}

Footprint ComputeFootprint(const ModelSpec& model, const std::vector<KvGroup>& groups,
                           const std::vector<PageClass>& classes, int64_t uniform_bytes_per_token,
                           int32_t block_tokens, int64_t tokens, int64_t encoder_tokens,
                           int64_t slab_bytes) {
  tokens = std::max<int64_t>(tokens, 0);
  encoder_tokens = std::max<int64_t>(encoder_tokens, 0);
  Footprint f;
  f.tokens = tokens;
  f.encoder_tokens = encoder_tokens;

  f.ideal_bytes = IdealBytes(model, tokens, encoder_tokens);

  f.pages_per_group.resize(groups.size());
  for (const KvGroup& g : groups) {
    const int64_t pages = PagesNeeded(g, tokens, encoder_tokens);
    f.pages_per_group[static_cast<size_t>(g.id)] = pages;
    // A page costs what it occupies in its buffer (more than the group's page in a per-layer
    // layout whose slots differ between the class's groups).
    const PageClass& c = classes[static_cast<size_t>(g.page_class)];
    f.hybridkv_bytes += slab_bytes > 0 && c.pages_per_slab > 0
                            ? pages * slab_bytes / c.pages_per_slab
                            : pages * c.page_bytes;
  }

  const int64_t slots = CeilDiv(tokens + encoder_tokens, block_tokens) * block_tokens;
  f.uniform_bytes = slots * uniform_bytes_per_token;
  // Without any attention layer the uniform layout has no token slots; it still keeps the state.
  if (!HasKvLayer(model)) f.uniform_bytes += model.state_bytes_per_sequence();
  return f;
}

double Footprint::hybridkv_waste() const {
  return WasteOf(hybridkv_bytes, ideal_bytes);
}
double Footprint::uniform_waste() const {
  return WasteOf(uniform_bytes, ideal_bytes);
}

int64_t Plan::num_pages() const {
  int64_t total = 0;
  for (const PageClass& c : page_classes)
    total += c.num_pages;
  return total;
}

Footprint Plan::FootprintOf(int64_t tokens, int64_t encoder_tokens) const {
  return ComputeFootprint(model, groups, page_classes, uniform_bytes_per_token,
                          options.block_tokens, tokens, encoder_tokens, arena.slab_bytes);
}

int64_t Plan::BlockOffset(const TensorView& v, int64_t block) const {
  if (!arena.enabled()) return v.offset + block * v.block_stride;
  const int64_t per = page_classes[static_cast<size_t>(v.page_class)].pages_per_slab;
  return SlabPageOffset(block, per, arena.slab_bytes, v.block_stride) + v.offset;
}

int64_t Plan::MaxSequences(int64_t tokens, int64_t encoder_tokens) const {
  const std::vector<int64_t> need =
      ClassDemand(groups, page_classes.size(), std::max<int64_t>(tokens, 0),
                  std::max<int64_t>(encoder_tokens, 0));
  if (arena.enabled()) {
    // Slabs go to whichever class needs them: the most n with sum ceil(n * need / per) slabs.
    const auto slabs = [&](int64_t n) {
      int64_t total = 0;
      for (size_t c = 0; c < need.size(); ++c)
        total += CeilDiv(n * need[c], page_classes[c].pages_per_slab);
      return total;
    };
    int64_t any = 0;
    for (int64_t x : need)
      any += x;
    if (any == 0) return std::numeric_limits<int64_t>::max();
    int64_t lo = 0, hi = 1;
    while (slabs(hi) <= arena.num_slabs)
      hi *= 2;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (slabs(mid) <= arena.num_slabs ? lo : hi) = mid;
    }
    return lo;
  }
  int64_t best = std::numeric_limits<int64_t>::max();  // a sequence needing no pages is unbounded
  for (size_t c = 0; c < need.size(); ++c) {
    if (need[c] > 0) best = std::min(best, page_classes[c].num_pages / need[c]);
  }
  return best;
}

int64_t Plan::MaxSequencesUniform(int64_t tokens, int64_t encoder_tokens) const {
  const int64_t bt = options.block_tokens;
  if (uniform_bytes_per_token == 0) {
    // Only recurrent layers: the uniform layout holds one state per sequence.
    const int64_t state = model.state_bytes_per_sequence();
    return state > 0 ? options.memory_bytes / state : std::numeric_limits<int64_t>::max();
  }
  const int64_t blocks = options.memory_bytes / (bt * uniform_bytes_per_token);
  const int64_t per_sequence =
      CeilDiv(std::max<int64_t>(tokens, 0) + std::max<int64_t>(encoder_tokens, 0), bt);
  return per_sequence > 0 ? blocks / per_sequence : std::numeric_limits<int64_t>::max();
}

}  // namespace hkv
