// The tiny models' forward pass, written once against a KvStore so that the dense reference and
// the paged runtime run exactly the same arithmetic and differ only in where K/V live.
//
// Contract: Forward computes positions [begin, end) of one sequence whose positions [0, begin)
// already have their K/V in `store`, writes the new positions' K/V to it (every cache-owning
// layer, before any of that layer's queries read), and returns one row of `vocab` logits per
// computed position. Attention follows each layer's rule: full (every earlier position), sliding
// window (the last `window` positions plus `sink_tokens` first ones), chunked local (the current
// chunk), learned per-head sink logits, RoPE unless the layer is NoPE, and KV-shared layers read
// their source layer's entries. Recurrent layers (Mamba-1, Mamba-2, gated DeltaNet stand-ins with
// the planned state shapes) run a causal depthwise conv over their conv state and a decaying
// state update over their ssm state, token by token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hkv/engine/tiny_model.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Row of num_kv_heads * head_dim floats for layer `layer` (an index into ModelSpec::layers of
  // a cache-owning layer) at position `pos`.
  virtual float* Key(int32_t layer, int64_t pos) = 0;
  virtual float* Value(int32_t layer, int64_t pos) = 0;
  // Recurrent layer `layer`'s working state tensor `which` (0: conv, 1: ssm). When the pass
  // starts it holds the state after `begin` tokens; the pass updates it in place.
  virtual float* State(int32_t layer, int which) = 0;
  // The pass has run recurrent layer `layer` over the first `position` tokens.
  virtual void AfterPosition(int32_t layer, int64_t position) = 0;
};

std::vector<float> Forward(const ModelSpec& spec, const ModelWeights& weights,
                           std::span<const int32_t> tokens, int64_t begin, int64_t end,
                           KvStore& store);

// The dense no-cache reference: recomputes the whole sequence from scratch with private K/V and
// returns the logits of every position.
std::vector<float> DenseLogits(const ModelSpec& spec, const ModelWeights& weights,
                               std::span<const int32_t> tokens);

// Index of the largest logit (the first on ties): greedy decoding.
int32_t Argmax(std::span<const float> logits);

}  // namespace hkv
