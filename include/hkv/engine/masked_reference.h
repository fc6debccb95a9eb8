// The masked reference: what a sparse-KV run must equal. The dense pass, with every sparse
// layer's queries restricted to the tokens that layer kept when the engine computed them.
//
// Contract: `steps` are the engine's steps of one sequence, in order, covering positions [0, n)
// without gaps (a step may have been replaced by its recomputation after a preemption). For each
// step, each sparse layer lists the positions it held before the step; the step's queries attend
// those plus the step's own positions up to their own. MaskedLogits runs the same forward pass as
// DenseLogits over a private contiguous store, so a run whose policies kept everything gives the
// dense logits bit for bit, and a run that evicted gives exactly what attention over the full
// cache masked to the kept tokens gives. It returns one row of logits per position [0, n).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hkv/engine/tiny_model.h>
#include <hkv/engine/transformer.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

struct SparseStepRecord {
  int64_t begin = 0, end = 0;
  std::vector<int32_t> layers;             // ModelSpec::layers indices of the sparse layers
  std::vector<std::vector<int64_t>> kept;  // per layer: positions it held before the step
};

std::vector<float> MaskedLogits(const ModelSpec& spec, const ModelWeights& weights,
                                std::span<const int32_t> tokens,
                                std::span<const SparseStepRecord> steps,
                                const EncoderInput& encoder = {});

}  // namespace hkv
