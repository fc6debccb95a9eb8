// Block streams: a set of blocks with their identities, serialised as one contiguous byte stream.
//
// Contract: ExportBlocks writes, for each requested (group, block), the block's canonical image
// (BlockMemoryView::Regions concatenated) behind a header that records its pool, group, prefix
// identity (or none), whether it is a recurrent-state checkpoint, the group's geometry
// fingerprint and a checksum (XXH3-64 over the header and the image). The stream starts with a
// magic, a format version, the block count and its own length, so it is self-delimiting.
// Because images are canonical, a stream exported from one layout imports into another
// (canonical, per-layer, two-level) of the same model.
// ParseBlockStream checks everything - magic, version, lengths, every checksum - and only then
// returns the blocks; ImportBlocks checks that the destination can take every block (group
// exists with the same fingerprint and pool, destination ids valid and distinct, one per block)
// before writing any byte. Every refusal is a Status naming the block and the field at fault,
// and leaves the output (export) or the destination memory (import) untouched.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/connector/block_memory_view.h>
#include <hkv/pool/block_hash.h>

namespace hkv {

inline constexpr uint32_t kBlockStreamVersion = 1;

// A block to export. `key`, when present, must be of the same group.
struct ExportBlock {
  int32_t group = 0;
  int64_t block = 0;
  std::optional<PrefixKey> key;
};

// One block as a parsed stream holds it; `image` points into the stream.
struct StreamBlock {
  int32_t pool = 0;
  int32_t group = 0;
  std::optional<PrefixKey> key;
  bool checkpoint = false;  // a block of the recurrent-state group
  uint64_t fingerprint = 0;
  std::span<const unsigned char> image;
};

// Bytes the stream of `blocks` takes; refuses an unknown group, a block outside its pool or a key
// of another group.
Result<int64_t> ExportedBytes(const BlockMemoryView& view, std::span<const ExportBlock> blocks);

// Writes the stream into `out`, which must be exactly ExportedBytes long.
Status ExportBlocks(const BlockMemoryView& view, std::span<const ExportBlock> blocks,
                    std::span<unsigned char> out);
Result<std::vector<unsigned char>> ExportBlocks(const BlockMemoryView& view,
                                                std::span<const ExportBlock> blocks);

Result<std::vector<StreamBlock>> ParseBlockStream(std::span<const unsigned char> stream);

// Writes block i of `blocks` (as ParseBlockStream returned them) into block dst_blocks[i] of its
// group in `dst`.
Status ImportBlocks(const BlockMemoryView& dst, std::span<const StreamBlock> blocks,
                    std::span<const int64_t> dst_blocks);
// ParseBlockStream, then ImportBlocks.
Status ImportBlocks(const BlockMemoryView& dst, std::span<const unsigned char> stream,
                    std::span<const int64_t> dst_blocks);

// One pass, for destinations that are discarded when an import fails (the connector's load
// targets: private blocks, published only after a successful load). ParseBlockStreamHeaders checks
// everything but the images' checksums, so a caller can inspect the identities first;
// ImportBlocksVerifying then checks the destinations as ImportBlocks does (refusing before any byte
// is written) and hashes each image as it copies it. A block that fails its checksum is refused
// after it was written: its destination, and those of the blocks before it, then hold bytes the
// caller must not use. It reads the stream once where ParseBlockStream + ImportBlocks read it
// twice. The blocks must come from ParseBlockStreamHeaders or ParseBlockStream (their images
// point into the stream, right after their headers).
Result<std::vector<StreamBlock>> ParseBlockStreamHeaders(std::span<const unsigned char> stream);
Status ImportBlocksVerifying(const BlockMemoryView& dst, std::span<const StreamBlock> blocks,
                             std::span<const int64_t> dst_blocks);

}  // namespace hkv
