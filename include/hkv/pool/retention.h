// Retention: where freed blocks go in their pool's eviction order.
//
// Contract: kNormal appends to the free list's tail (evicted after every block freed before);
// kLow puts them at its head (evicted first), for blocks worth nothing or of low-priority
// requests; kProbation queues cached blocks as BlockPool::Demote does (after the blocks worth
// nothing, ahead of every block freed to the tail, still serving hits), except blocks of a shared
// prefix that a branch bonus keeps, which are queued as with kNormal. Its own header so that
// request descriptions need not see the pool.
#pragma once

namespace hkv {

enum class Retention : unsigned char {
  kNormal,     // free-list tail: evicted after every block freed before
  kLow,        // free-list head: evicted before every other free block
  kProbation,  // ahead of every block freed to the tail, behind blocks worth nothing
};

}  // namespace hkv
