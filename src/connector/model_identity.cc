#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include <hkv/connector/model_identity.h>

#include "checked_format.h"

namespace hkv {
namespace {

// Feeds fixed-width little-endian fields and length-prefixed strings, so that no two different
// inputs hash the same byte sequence by running together.
class Digest {
 public:
  Digest() { XXH3_128bits_reset(&state_); }
  void U64(uint64_t v) {
    unsigned char b[8];
    connector_format::Put64(b, v);
    XXH3_128bits_update(&state_, b, sizeof b);
  }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Str(std::string_view s) {
    U64(s.size());
    XXH3_128bits_update(&state_, s.data(), s.size());
  }
  void Bytes(const void* p, size_t n) { XXH3_128bits_update(&state_, p, n); }
  ModelIdentity Finish() {
    const XXH128_hash_t h = XXH3_128bits_digest(&state_);
    return {h.high64, h.low64};
  }

 private:
  XXH3_state_t state_;
};

void HashLayer(Digest& d, const LayerSpec& l) {
  d.I64(l.layer);
  d.I64(static_cast<int64_t>(l.kind));
  for (int64_t v :
       {int64_t{l.num_q_heads}, int64_t{l.num_kv_heads}, int64_t{l.head_dim_k},
        int64_t{l.head_dim_v}, static_cast<int64_t>(l.kv_dtype), int64_t{l.window},
        int64_t{l.chunk}, int64_t{l.sink_tokens}, int64_t{l.learned_sinks}, int64_t{l.rope},
        int64_t{l.kv_source_layer}, int64_t{l.kv_lora_rank}, int64_t{l.qk_rope_head_dim}}) {
    d.I64(v);
  }
  const RecurrentGeometry& r = l.recurrent;
  for (int32_t v : {r.d_conv, r.d_inner, r.d_state, r.n_heads, r.head_dim, r.n_groups,
                    r.num_k_heads, r.k_head_dim, r.num_v_heads, r.v_head_dim}) {
    d.I64(v);
  }
  d.U64(l.state.size());
  for (const StateTensor& t : l.state) {
    d.Str(t.name);
    d.I64(static_cast<int64_t>(t.dtype));
    d.U64(t.shape.size());
    for (int64_t s : t.shape)
      d.I64(s);
  }
}

Status HashFile(Digest& d, const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::IoError(fmt::format("model identity: cannot open weight file {}: {}",
                                       path.string(), std::strerror(errno)));
  }
  d.Str(path.filename().string());
  std::vector<char> buf(size_t{1} << 20);
  uint64_t total = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<size_t>(in.gcount());
    d.Bytes(buf.data(), got);
    total += got;
  }
  if (in.bad()) {
    return Status::IoError(
        fmt::format("model identity: cannot read weight file {}", path.string()));
  }
  // The length closes the file's bytes, as Str's prefix does for a string.
  d.U64(total);
  return Status::Ok();
}

}  // namespace

std::string ModelIdentity::Hex() const {
  return fmt::format("{:016x}{:016x}", hi, lo);
}

Result<ModelIdentity> ModelIdentity::FromHex(std::string_view hex) {
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdef") != std::string_view::npos) {
    return Status::InvalidArgument(
        fmt::format("model identity: '{}' is not 32 lowercase hex digits", hex.substr(0, 64)));
  }
  ModelIdentity m;
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    const uint64_t v =
        c <= '9' ? static_cast<uint64_t>(c - '0') : static_cast<uint64_t>(c - 'a' + 10);
    uint64_t& half = i < 16 ? m.hi : m.lo;
    half = (half << 4) | v;
  }
  return m;
}

Result<ModelIdentity> ComputeModelIdentity(const ModelSpec& spec,
                                           const ModelIdentitySources& sources) {
  if (sources.weights_id.empty() && sources.weight_files.empty()) {
    return Status::InvalidArgument(
        "model identity: name the weights (weights_id or weight_files): models that share a "
        "config, like a base and its fine-tune, would share an identity");
  }
  if (sources.block_tokens < 0) {
    return Status::InvalidArgument(
        fmt::format("model identity: block_tokens {} is negative", sources.block_tokens));
  }
  Digest d;
  d.Str("hybridkv model identity v1");
  d.Str(spec.model_type);
  d.I64(spec.num_layers);
  d.I64(spec.hidden_size);
  d.U64(spec.layers.size());
  for (const LayerSpec& l : spec.layers)
    HashLayer(d, l);
  d.Str(sources.weights_id);
  std::vector<std::filesystem::path> files = sources.weight_files;
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return a.filename() < b.filename(); });
  d.U64(files.size());
  for (const auto& f : files)
    HKV_RETURN_IF_ERROR(HashFile(d, f));
  d.Str(sources.salt);
  d.I64(sources.block_tokens);
  return d.Finish();
}

}  // namespace hkv
