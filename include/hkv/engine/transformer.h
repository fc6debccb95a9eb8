// The tiny models' forward pass, written once against a KvStore so that the dense reference and
// the paged runtime run exactly the same arithmetic and differ only in where K/V live.
//
// Contract: Forward computes positions [begin, end) of one sequence whose positions [0, begin)
// already have their K/V in `store`, writes the new positions' K/V to it (every cache-owning
// layer, before any of that layer's queries read), and returns one row of `vocab` logits per
// computed position. Attention follows each layer's rule: full (every earlier position), sliding
// window (the last `window` positions plus `sink_tokens` first ones), chunked local (the current
// chunk), learned per-head sink logits, RoPE unless the layer is NoPE, and KV-shared layers read
// their source layer's entries. MLA layers cache one latent per token and attend in the absorbed
// form (queries mapped into the latent space, values read from it). Cross-attention layers attend
// to every encoder token; their K/V are computed from StandInEncoder only when the store says
// they are pending. Recurrent layers (Mamba-1, Mamba-2, gated DeltaNet stand-ins with
// the planned state shapes) run a causal depthwise conv over their conv state and a decaying
// state update over their ssm state, token by token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hkv/engine/tiny_model.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

// A cross-attention request's encoder input: a stand-in encoder turns the image id into `tokens`
// hidden vectors (StandInEncoder), so equal ids give equal encoder outputs.
struct EncoderInput {
  uint64_t image = 0;
  int64_t tokens = 0;
  bool operator==(const EncoderInput&) const = default;
};

// Rows of a layer's cache from one position on: `k` (and `v`, null for MLA, whose single latent
// row is `k`) point at the row of `pos`, and rows [pos, pos + n) follow one another in memory,
// so attention reads a run per call rather than a row.
struct KvRows {
  float* k = nullptr;
  float* v = nullptr;
  int64_t n = 0;
};

// A sparse layer's cache (a policy evicts its tokens, hkv/policy): the layer holds slots, not
// positions. Slot i holds the token at positions[i]; the kept tokens come first, then the step's
// own positions from slot first_new on (positions ascend). A query attends every slot up to its
// own. When feedback_rows > 0 the pass adds, for the step's last feedback_rows query rows, each
// softmax weight divided by the query heads sharing the KV head to feedback[kv head][slot]
// (which must hold num_kv_heads * positions.size() floats): weights summed over those rows and
// averaged over the query heads of each KV head, from the very computation that produces the
// layer's output.
struct SlotView {
  std::span<const int64_t> positions;
  int64_t first_new = 0;
  int32_t feedback_rows = 0;
  std::span<float> feedback;
};

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Sparse layers: Rows(layer, i) then addresses slot i (the step's position p is slot
  // first_new + p - begin). Null for a layer addressed by position, which every layer but a
  // full-attention or MLA one is.
  virtual const SlotView* Slots(int32_t /*layer*/) { return nullptr; }
  // Layer `layer` (an index into ModelSpec::layers of a cache-owning layer) from decoder
  // position `pos` on, or from encoder token `pos` on for a cross-attention layer. A row is
  // num_kv_heads * head_dim floats.
  virtual KvRows Rows(int32_t layer, int64_t pos) = 0;
  // Whether the pass must compute the encoder's K/V (they are not cached yet).
  virtual bool EncoderPending() const = 0;
  // Recurrent layer `layer`'s working state tensor `which` (0: conv, 1: ssm). When the pass
  // starts it holds the state after `begin` tokens; the pass updates it in place.
  virtual float* State(int32_t layer, int which) = 0;
  // The pass has run recurrent layer `layer` over the first `position` tokens.
  virtual void AfterPosition(int32_t layer, int64_t position) = 0;
};

// Private, contiguous K/V and states for every layer of one sequence of up to `tokens` tokens:
// the dense reference's store, and the contiguous side of the paged-attention benchmark.
class ContiguousKvStore : public KvStore {
 public:
  ContiguousKvStore(const ModelSpec& spec, int64_t tokens, int64_t encoder_tokens);
  KvRows Rows(int32_t layer, int64_t pos) override;
  bool EncoderPending() const override { return true; }
  float* State(int32_t layer, int which) override;
  void AfterPosition(int32_t, int64_t) override {}

 private:
  struct Layer {
    size_t k_width = 0, v_width = 0;
    int64_t rows = 0;
    std::vector<float> k, v, conv, ssm;
  };
  std::vector<Layer> layers_;
};

// Encoder output for `input`: tokens x hidden floats, a pure function of (image, token, hidden).
std::vector<float> StandInEncoder(const EncoderInput& input, int32_t hidden);

std::vector<float> Forward(const ModelSpec& spec, const ModelWeights& weights,
                           std::span<const int32_t> tokens, int64_t begin, int64_t end,
                           KvStore& store, const EncoderInput& encoder = {});

// The dense no-cache reference: recomputes the whole sequence from scratch with private K/V and
// returns the logits of every position.
std::vector<float> DenseLogits(const ModelSpec& spec, const ModelWeights& weights,
                               std::span<const int32_t> tokens, const EncoderInput& encoder = {});

// Index of the largest logit (the first on ties): greedy decoding.
int32_t Argmax(std::span<const float> logits);

}  // namespace hkv
