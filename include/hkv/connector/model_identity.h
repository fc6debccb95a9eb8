// ModelIdentity: a 128-bit digest of everything that decides what a stored block's bytes mean -
// the model's cache geometry and dtypes, its weights, the block size and any salt (tokenizer,
// adapter, cache salt) - so that tiers shared by several models never give one model another's
// KV, even when the two have identical shapes (a base and its fine-tune).
//
// Contract: ComputeModelIdentity is a pure function of its inputs: the same spec, weights
// identity, block size and salt give the same digest in every process and on every host; a change
// to any of them gives another. It hashes the spec's cache-relevant fields (every layer's kind,
// widths, dtypes, windows, chunks, sinks, sharing and recurrent state tensors), not the file it
// came from. The weights must be named: by `weights_id` (an identity the user vouches for - a
// checkpoint's commit hash, a release tag), by `weight_files` (hashed by content, sorted by file
// name, so the digest does not depend on the order they are given in), or both; a spec alone is
// refused, because two fine-tunes share it. An unreadable weight file is an IoError naming it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

struct ModelIdentity {
  uint64_t hi = 0;
  uint64_t lo = 0;

  // 32 lowercase hex digits, hi first: how files, directories and server keys name a model.
  std::string Hex() const;
  // The inverse of Hex; InvalidArgument for anything but 32 hex digits.
  static Result<ModelIdentity> FromHex(std::string_view hex);
  bool operator==(const ModelIdentity&) const = default;
};

struct ModelIdentitySources {
  std::string weights_id;
  std::vector<std::filesystem::path> weight_files;
  std::string salt;
  int32_t block_tokens = 0;  // the engine's base block size; 0 when blocks do not depend on it
};

Result<ModelIdentity> ComputeModelIdentity(const ModelSpec& spec,
                                           const ModelIdentitySources& sources);

}  // namespace hkv
