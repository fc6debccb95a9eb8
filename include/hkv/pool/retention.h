// Retention: where freed blocks go in their pool's eviction order.
//
// Contract: kNormal appends to the free list's tail (evicted after every block freed before);
// kLow puts them at its head (evicted first), for blocks worth nothing or of low-priority
// requests. Its own header so that request descriptions need not see the pool.
#pragma once

namespace hkv {

enum class Retention : unsigned char {
  kNormal,  // free-list tail: evicted after every block freed before
  kLow,     // free-list head: evicted before every other free block
};

}  // namespace hkv
