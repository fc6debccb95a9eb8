// Tier transfer: moving a tier's entries (single-block streams under their prefix identities) to
// another process - prefill -> decode disaggregation over a Unix socket, a pipe, or any byte
// channel.
//
// Contract:
// - SerializeTierEntries writes every entry of a tier (least recently used first) as one
//   message: a header (magic, version, entry count) and per entry its key and length, then its
//   bytes. The bytes are the block streams the tier holds, each with its own checksums.
// - DeserializeTierEntries puts the entries of a message into a tier, in order, and reports how
//   many it took. A message cut short (a sender that died, a truncated channel) keeps the entries
//   that arrived whole and fails with kIoError saying how many of how many arrived. Headers carry
//   checksums: a damaged message header fails with kInvalidArgument before anything is put, a
//   damaged entry header the same way after the entries before it. Entry bytes are not parsed here:
//   a damaged entry is caught when it is loaded (TierConnector checks every stream and its key)
//   and becomes a miss - the decode side recomputes, never uses wrong bytes.
// - SendAll / ReceiveAll move a message over a file descriptor: all of it (retrying short writes
//   and EINTR, without SIGPIPE on sockets), and everything until the peer closes - at most
//   `max_bytes`: a longer message is refused (kResourceExhausted naming the limit) once the limit
//   is passed, so a peer cannot make the receiver allocate without bound.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/connector/tier.h>

namespace hkv {

Result<std::vector<unsigned char>> SerializeTierEntries(Tier& tier);
Result<int64_t> DeserializeTierEntries(std::span<const unsigned char> message, Tier& into);

Status SendAll(int fd, std::span<const unsigned char> bytes);
Result<std::vector<unsigned char>> ReceiveAll(int fd, int64_t max_bytes);

}  // namespace hkv
