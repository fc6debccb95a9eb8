#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <hkv/connector/block_stream.h>

#include "checked_format.h"

namespace hkv {
namespace {

using connector_format::Get32;
using connector_format::Get64;
using connector_format::Put32;
using connector_format::Put64;

// "hkvblks" and a zero byte, read as a little-endian integer.
constexpr uint64_t kMagic = 0x00736b6c62766b68ull;
constexpr int64_t kStreamHeader = 32;  // magic, version, count, total bytes, reserved
constexpr int64_t kBlockHeader = 64;   // see BlockHeader
constexpr int64_t kChecksumAt = 56;    // the checksum is the header's last field
constexpr uint32_t kHasKey = 1, kCheckpoint = 2;
// Export copies and hashes a chunk at a time so the hash reads bytes still in cache.
constexpr int64_t kChunk = int64_t{128} << 10;

// The header's own digest seeds the image's, so one checksum covers both.
uint64_t HeaderSeed(const unsigned char* header) {
  return connector_format::HeaderSeed({header, static_cast<size_t>(kChecksumAt)});
}

Status CheckExport(const BlockMemoryView& view, std::span<const ExportBlock> blocks) {
  if (blocks.size() > UINT32_MAX) {
    return Status::InvalidArgument(
        fmt::format("export: {} blocks, a stream holds at most {}", blocks.size(), UINT32_MAX));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const ExportBlock& b = blocks[i];
    if (b.group < 0 || b.group >= view.num_groups()) {
      return Status::InvalidArgument(fmt::format("export: block {} names group {}, the plan has {}",
                                                 i, b.group, view.num_groups()));
    }
    const GroupRefs& g = view.group(b.group);
    if (!view.ValidBlock(g.pool, b.block)) {
      return Status::InvalidArgument(
          fmt::format("export: block {} has id {}, outside pool {} of group {} (ids {}..{})", i,
                      b.block, g.pool, b.group, view.first_block(g.pool),
                      view.first_block(g.pool) + view.num_blocks(g.pool) - 1));
    }
    if (b.key && b.key->group != b.group) {
      return Status::InvalidArgument(
          fmt::format("export: block {} of group {} carries a prefix key of group {}", i, b.group,
                      b.key->group));
    }
  }
  return Status::Ok();
}

int64_t StreamBytes(const BlockMemoryView& view, std::span<const ExportBlock> blocks) {
  int64_t bytes = kStreamHeader;
  for (const ExportBlock& b : blocks)
    bytes += kBlockHeader + view.group(b.group).image_bytes;
  return bytes;
}

}  // namespace

Result<int64_t> ExportedBytes(const BlockMemoryView& view, std::span<const ExportBlock> blocks) {
  HKV_RETURN_IF_ERROR(CheckExport(view, blocks));
  return StreamBytes(view, blocks);
}

Status ExportBlocks(const BlockMemoryView& view, std::span<const ExportBlock> blocks,
                    std::span<unsigned char> out) {
  HKV_RETURN_IF_ERROR(CheckExport(view, blocks));
  const int64_t total = StreamBytes(view, blocks);
  if (static_cast<int64_t>(out.size()) != total) {
    return Status::InvalidArgument(
        fmt::format("export: the output has {} bytes, the stream of {} blocks takes {}", out.size(),
                    blocks.size(), total));
  }
  unsigned char* p = out.data();
  Put64(p, kMagic);
  Put32(p + 8, kBlockStreamVersion);
  Put32(p + 12, static_cast<uint32_t>(blocks.size()));
  Put64(p + 16, static_cast<uint64_t>(total));
  Put64(p + 24, 0);
  p += kStreamHeader;
  std::vector<BlockRegion> regions;
  XXH3_state_t state;
  // A state on the stack must be initialised before its first seeded reset: the reset skips
  // deriving the secret when the old contents happen to name the same seed.
  XXH3_INITSTATE(&state);
  for (const ExportBlock& b : blocks) {
    const GroupRefs& g = view.group(b.group);
    unsigned char* header = p;
    Put32(header, static_cast<uint32_t>(g.pool));
    Put32(header + 4, static_cast<uint32_t>(b.group));
    Put32(header + 8, (b.key ? kHasKey : 0) | (g.is_state ? kCheckpoint : 0));
    Put32(header + 12, static_cast<uint32_t>(b.key ? b.key->group : 0));
    Put64(header + 16, b.key ? b.key->hash.lo : 0);
    Put64(header + 24, b.key ? b.key->hash.hi : 0);
    Put64(header + 32, g.fingerprint);
    Put64(header + 40, static_cast<uint64_t>(g.image_bytes));
    Put64(header + 48, 0);
    XXH3_64bits_reset_withSeed(&state, HeaderSeed(header));
    p += kBlockHeader;
    // Checked above, so this cannot fail.
    (void)view.Regions(b.group, b.block, regions);
    for (const BlockRegion& r : regions) {
      for (int64_t done = 0; done < r.bytes; done += kChunk) {
        const auto n = static_cast<size_t>(std::min(kChunk, r.bytes - done));
        // Hash the source chunk (reading it into cache once), then stream it out: memory sees one
        // read and one write per byte, as for a plain large memcpy.
        connector_format::Xxh3Update(&state, r.data + done, n);
        connector_format::CopyStreaming(p, r.data + done, n);
        p += n;
      }
    }
    Put64(header + kChecksumAt, XXH3_64bits_digest(&state));
  }
  return Status::Ok();
}

Result<std::vector<unsigned char>> ExportBlocks(const BlockMemoryView& view,
                                                std::span<const ExportBlock> blocks) {
  HKV_ASSIGN_OR_RETURN(const int64_t bytes, ExportedBytes(view, blocks));
  std::vector<unsigned char> out(static_cast<size_t>(bytes));
  HKV_RETURN_IF_ERROR(ExportBlocks(view, blocks, out));
  return out;
}

namespace {

Result<std::vector<StreamBlock>> ParseStream(std::span<const unsigned char> stream, bool verify) {
  const auto size = static_cast<int64_t>(stream.size());
  if (size < kStreamHeader) {
    return Status::ParseError(fmt::format(
        "block stream: {} bytes, shorter than the {}-byte stream header", size, kStreamHeader));
  }
  const unsigned char* p = stream.data();
  if (Get64(p) != kMagic) {
    return Status::ParseError("block stream: the magic is not \"hkvblks\"; not a block stream");
  }
  if (Get32(p + 8) != kBlockStreamVersion) {
    return Status::Unsupported(fmt::format("block stream: version {}, this build reads {}",
                                           Get32(p + 8), kBlockStreamVersion));
  }
  const uint32_t count = Get32(p + 12);
  if (Get64(p + 16) != static_cast<uint64_t>(size)) {
    return Status::ParseError(fmt::format(
        "block stream: the header says {} bytes, the stream has {} (truncated or padded)",
        Get64(p + 16), size));
  }
  if (Get64(p + 24) != 0) return Status::ParseError("block stream: reserved header field not 0");
  std::vector<StreamBlock> blocks;
  int64_t at = kStreamHeader;
  for (uint32_t i = 0; i < count; ++i) {
    if (size - at < kBlockHeader) {
      return Status::ParseError(
          fmt::format("block stream: block {} header runs past the end (at byte {})", i, at));
    }
    const unsigned char* header = p + at;
    const uint64_t image_bytes = Get64(header + 40);
    if (image_bytes > static_cast<uint64_t>(size - at - kBlockHeader)) {
      return Status::ParseError(
          fmt::format("block stream: block {} claims {} image bytes, {} remain", i, image_bytes,
                      size - at - kBlockHeader));
    }
    const uint32_t flags = Get32(header + 8);
    if ((flags & ~(kHasKey | kCheckpoint)) != 0) {
      return Status::ParseError(
          fmt::format("block stream: block {} has unknown flags {:#x}", i, flags));
    }
    if (Get64(header + 48) != 0) {
      return Status::ParseError(fmt::format(
          "block stream: block {} has reserved field {:#x}: expected 0", i, Get64(header + 48)));
    }
    const unsigned char* image = header + kBlockHeader;
    if (verify && connector_format::Xxh3WithSeed(image, image_bytes, HeaderSeed(header)) !=
                      Get64(header + kChecksumAt)) {
      return Status::ParseError(
          fmt::format("block stream: block {} fails its checksum (corrupt data)", i));
    }
    StreamBlock b;
    b.pool = static_cast<int32_t>(Get32(header));
    b.group = static_cast<int32_t>(Get32(header + 4));
    if ((flags & kHasKey) != 0) {
      b.key = PrefixKey{BlockHash{Get64(header + 16), Get64(header + 24)},
                        static_cast<int32_t>(Get32(header + 12))};
    }
    b.checkpoint = (flags & kCheckpoint) != 0;
    b.fingerprint = Get64(header + 32);
    b.image = {image, static_cast<size_t>(image_bytes)};
    blocks.push_back(b);
    at += kBlockHeader + static_cast<int64_t>(image_bytes);
  }
  if (at != size) {
    return Status::ParseError(
        fmt::format("block stream: {} blocks end at byte {}, the stream has {}", count, at, size));
  }
  return blocks;
}

}  // namespace

Result<std::vector<StreamBlock>> ParseBlockStream(std::span<const unsigned char> stream) {
  return ParseStream(stream, /*verify=*/true);
}

Result<std::vector<StreamBlock>> ParseBlockStreamHeaders(std::span<const unsigned char> stream) {
  return ParseStream(stream, /*verify=*/false);
}

namespace {

// What both imports check before writing anything: one valid, distinct destination per block, of
// the block's group, with the same geometry.
Status CheckDestinations(const BlockMemoryView& dst, std::span<const StreamBlock> blocks,
                         std::span<const int64_t> dst_blocks) {
  if (dst_blocks.size() != blocks.size()) {
    return Status::InvalidArgument(fmt::format("import: {} destination blocks for a stream of {}",
                                               dst_blocks.size(), blocks.size()));
  }
  std::vector<std::pair<int32_t, int64_t>> targets;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const StreamBlock& b = blocks[i];
    if (b.group < 0 || b.group >= dst.num_groups()) {
      return Status::InvalidArgument(fmt::format(
          "import: block {} is of group {}, the destination has {}", i, b.group, dst.num_groups()));
    }
    const GroupRefs& g = dst.group(b.group);
    const auto mismatch = [&](const std::string& what) {
      return Status::InvalidArgument(
          fmt::format("import: block {} of group {} does not match the destination's geometry: {}",
                      i, b.group, what));
    };
    if (b.pool != g.pool) {
      return mismatch(
          fmt::format("it is of pool {}, the group's blocks are of pool {}", b.pool, g.pool));
    }
    if (b.checkpoint != g.is_state) {
      return mismatch(b.checkpoint ? "it is a state checkpoint, the group keeps tokens"
                                   : "it holds tokens, the group keeps a state");
    }
    if (static_cast<int64_t>(b.image.size()) != g.image_bytes) {
      return mismatch(fmt::format("it has {} image bytes, the group's blocks have {}",
                                  b.image.size(), g.image_bytes));
    }
    if (b.fingerprint != g.fingerprint) {
      return mismatch(
          fmt::format("its fingerprint {:#x} is not the group's {:#x} (other layers "
                      "or tensor shapes)",
                      b.fingerprint, g.fingerprint));
    }
    if (!dst.ValidBlock(g.pool, dst_blocks[i])) {
      return Status::InvalidArgument(fmt::format(
          "import: destination {} of block {} is outside pool {} (ids {}..{})", dst_blocks[i], i,
          g.pool, dst.first_block(g.pool), dst.first_block(g.pool) + dst.num_blocks(g.pool) - 1));
    }
    targets.emplace_back(g.pool, dst_blocks[i]);
  }
  std::sort(targets.begin(), targets.end());
  const auto dup = std::adjacent_find(targets.begin(), targets.end());
  if (dup != targets.end()) {
    return Status::InvalidArgument(
        fmt::format("import: block {} of pool {} is the destination of two stream blocks",
                    dup->second, dup->first));
  }
  return Status::Ok();
}

}  // namespace

Status ImportBlocks(const BlockMemoryView& dst, std::span<const StreamBlock> blocks,
                    std::span<const int64_t> dst_blocks) {
  HKV_RETURN_IF_ERROR(CheckDestinations(dst, blocks, dst_blocks));
  std::vector<BlockRegion> regions;
  for (size_t i = 0; i < blocks.size(); ++i) {
    (void)dst.Regions(blocks[i].group, dst_blocks[i], regions);  // checked above
    const unsigned char* from = blocks[i].image.data();
    for (const BlockRegion& r : regions) {
      connector_format::CopyStreaming(r.data, from, static_cast<size_t>(r.bytes));
      from += r.bytes;
    }
  }
  return Status::Ok();
}

Status ImportBlocksVerifying(const BlockMemoryView& dst, std::span<const StreamBlock> blocks,
                             std::span<const int64_t> dst_blocks) {
  HKV_RETURN_IF_ERROR(CheckDestinations(dst, blocks, dst_blocks));
  std::vector<BlockRegion> regions;
  XXH3_state_t state;
  // A state on the stack must be initialised before its first seeded reset: the reset skips
  // deriving the secret when the old contents happen to name the same seed.
  XXH3_INITSTATE(&state);
  for (size_t i = 0; i < blocks.size(); ++i) {
    // The header sits right before the image in the stream (ParseBlockStream*).
    const unsigned char* header = blocks[i].image.data() - kBlockHeader;
    XXH3_64bits_reset_withSeed(&state, HeaderSeed(header));
    (void)dst.Regions(blocks[i].group, dst_blocks[i], regions);  // checked above
    const unsigned char* from = blocks[i].image.data();
    for (const BlockRegion& r : regions) {
      for (int64_t done = 0; done < r.bytes; done += kChunk) {
        const auto n = static_cast<size_t>(std::min(kChunk, r.bytes - done));
        connector_format::Xxh3Update(&state, from, n);
        connector_format::CopyStreaming(r.data + done, from, n);
        from += n;
      }
    }
    if (XXH3_64bits_digest(&state) != Get64(header + kChecksumAt)) {
      return Status::ParseError(fmt::format(
          "block stream: block {} fails its checksum (corrupt data); destinations up to it were "
          "written and must be discarded",
          i));
    }
  }
  return Status::Ok();
}

Status ImportBlocks(const BlockMemoryView& dst, std::span<const unsigned char> stream,
                    std::span<const int64_t> dst_blocks) {
  HKV_ASSIGN_OR_RETURN(const std::vector<StreamBlock> blocks, ParseBlockStream(stream));
  return ImportBlocks(dst, blocks, dst_blocks);
}

}  // namespace hkv
