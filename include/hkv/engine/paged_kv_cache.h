// PagedKvCache: the planned buffers (one per page class) holding every layer's K/V, addressed only
// through the manager's block tables and slot mappings.
//
// Contract: Create allocates each page class's buffer as the plan lays it out (num_pages pages of
// page_bytes, tensors at their TensorView offsets and strides); block b of a pool is page b of
// its class. ApplyCopies performs a step's copy-on-write copies for every tensor of the copied
// group. View(manager, id) is a KvStore for one request's open step: positions of the step are
// written to the slots SlotMapping assigns, earlier positions are read through BlockTable; a read
// of the null block or of a position outside the table is a failure the store records (and the
// engine reports), never a silent read of somebody else's data. Recurrent layers work on the
// step's write slot: View initialises it from the read slot (the null block reads as the zero
// state) and copies it into each snapshot slot at its position. ApplyMoves performs a
// compaction's page moves (KvCacheManager::Compact): every tensor of the page's class, src -> dst,
// which must happen before anything reads the cache again.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/engine/transformer.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/plan/plan.h>

namespace hkv {

class PagedKvCache {
 public:
  static Result<PagedKvCache> Create(const Plan& plan);

  void ApplyCopies(std::span<const BlockCopy> copies);
  // Copies each moved page, all of its class's tensors, from src to dst (pool = page class).
  void ApplyMoves(std::span<const PageMove> moves);

  // Sparse KV, after KvCacheManager::Evict: for each slot s in [from, keep.size()), copies layer
  // `layer`'s K/V row of old slot keep[s] (addressed through `old_table`, the group's table before
  // the call) to slot s (through `new_table`). keep ascends and keep[s] >= s, so going up in slot
  // order never overwrites a row still to be read.
  void MoveSlots(int32_t layer, std::span<const int32_t> old_table,
                 std::span<const int32_t> new_table, std::span<const int32_t> keep, int64_t from);

  // Debugging aid: fills with NaN every block that became free without a prefix identity since
  // the last call (call it after every manager call that allocates or frees). No request may read
  // such a block again, so an engine that reads one anyway - a stale table, a step it was not
  // given, state it did not initialise - gets NaN logits instead of plausible leftovers.
  // Fails only when the manager's pools do not match the plan's page classes.
  Status PoisonFreeBlocks(const KvCacheManager& manager);

  class StepView : public KvStore {
   public:
    // Rows of one block at most (and of one side of the step's begin and end).
    KvRows Rows(int32_t layer, int64_t pos) override;
    bool EncoderPending() const override { return run_encoder_; }
    // Sparse layers: the engine says which slots a layer holds for this step; the view must
    // outlive the pass. Rows(layer, i) then reads slot i through the group's table.
    void SetSlots(int32_t layer, const SlotView* view);
    const SlotView* Slots(int32_t layer) override;
    // The state lives in the step's write slot (initialised from the read slot, or zero).
    float* State(int32_t layer, int which) override;
    // Copies the layer's state into the slot the manager asked for at `position`, if any.
    void AfterPosition(int32_t layer, int64_t position) override;
    // The first addressing failure, or OK.
    const Status& status() const { return status_; }

   private:
    friend class PagedKvCache;
    KvRows Fail(int32_t layer, int64_t pos, std::string why);

    PagedKvCache* cache_ = nullptr;
    int64_t begin_ = 0, end_ = 0;
    bool run_encoder_ = false;
    std::vector<std::span<const int32_t>> tables_;  // per group
    std::vector<std::vector<int64_t>> slots_;       // per group, positions [begin, end)
    std::vector<StateStep> states_;                 // per group (state groups only)
    std::vector<const SlotView*> sparse_;           // per LayerSpec; null: by position
    Status status_;
    std::vector<float> scratch_;  // returned after a failure so the forward pass can finish
  };

  // Views of request `id`'s open step.
  Result<std::unique_ptr<StepView>> View(const KvCacheManager& manager, RequestId id);

  // The planned buffers, as the plan lays them out (one per page class, or the one slab buffer of
  // a two-level plan): what BlockMemoryView::Create takes, so a connector can move blocks.
  std::vector<std::span<unsigned char>> Buffers();

 private:
  struct LayerTensors {
    int32_t k = -1, v = -1, conv = -1, ssm = -1;  // indices into plan_.layout.tensors
  };
  unsigned char* BlockOf(int32_t tensor, int32_t block);
  void CopyState(int32_t layer, int32_t from, int32_t to);
  explicit PagedKvCache(const Plan& plan);

  Plan plan_;
  // One zeroed buffer per page class, 2 MiB aligned and backed by huge pages where the OS
  // allows: a paged read jumps between blocks, and 4 KiB pages would turn each jump into a TLB
  // miss that a contiguous store does not pay.
  struct Buffer {
    struct Free {
      void operator()(unsigned char* p) const;
    };
    std::unique_ptr<unsigned char[], Free> bytes;
    int64_t size = 0;  // as planned (the allocation is rounded up to huge pages)
    unsigned char* data() const { return bytes.get(); }
  };
  static Buffer AllocateBuffer(int64_t bytes);
  std::vector<Buffer> buffers_;  // per page class, or one shared by all (two-level)
  unsigned char* BufferOf(int32_t page_class) {
    return buffers_[plan_.arena.enabled() ? 0 : static_cast<size_t>(page_class)].data();
  }
  std::vector<std::vector<char>> poisoned_;  // per page class, per block
  std::vector<int32_t> scratch_blocks_;
  std::vector<char> scratch_flags_;
  std::vector<int32_t> group_of_layer_;              // per LayerSpec; -1: owns no cache
  std::vector<std::vector<int32_t>> class_tensors_;  // per page class: its tensors
  std::vector<LayerTensors> tensors_;                // per LayerSpec
  // How Rows finds a cache-owning layer's rows, resolved once from the plan: row `o` of block b
  // is at base + b * block_stride + o * row_bytes, or with two-level memory at
  // base + slab(b) * slab_bytes + page(b) * block_stride + o * row_bytes.
  struct RowAddress {
    int32_t group = -1;
    bool encoder = false;
    int64_t block_tokens = 0;
    unsigned char* k_base = nullptr;
    unsigned char* v_base = nullptr;  // null for MLA
    int64_t k_stride = 0, v_stride = 0, k_row = 0, v_row = 0;
    int64_t pages_per_slab = 0, slab_bytes = 0;  // two-level only

    unsigned char* Block(unsigned char* base, int64_t stride, int64_t block) const {
      if (pages_per_slab == 0) return base + block * stride;
      return base + SlabPageOffset(block, pages_per_slab, slab_bytes, stride);
    }
  };
  std::vector<RowAddress> address_;  // per LayerSpec
};

}  // namespace hkv
