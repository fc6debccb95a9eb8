#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include <fmt/format.h>
#include <sys/mman.h>

#include <hkv/engine/paged_kv_cache.h>
#include <hkv/manager/manager_probe.h>
#include <hkv/pool/block_pool.h>

namespace hkv {

PagedKvCache::PagedKvCache(const Plan& plan) : plan_(plan) {}

void PagedKvCache::Buffer::Free::operator()(unsigned char* p) const {
  std::free(p);
}

PagedKvCache::Buffer PagedKvCache::AllocateBuffer(int64_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t size =
      (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + kHuge - 1) / kHuge * kHuge;
  auto* p = static_cast<unsigned char*>(std::aligned_alloc(kHuge, size));
  if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(p, size, MADV_HUGEPAGE);  // advice only: without huge pages the cache still works
#endif
  std::memset(p, 0, size);
  return Buffer{std::unique_ptr<unsigned char[], Buffer::Free>(p), bytes};
}

std::vector<std::span<unsigned char>> PagedKvCache::Buffers() {
  std::vector<std::span<unsigned char>> out;
  for (const Buffer& b : buffers_)
    out.emplace_back(b.data(), static_cast<size_t>(b.size));
  return out;
}

Result<PagedKvCache> PagedKvCache::Create(const Plan& plan) {
  PagedKvCache c(plan);
  if (plan.arena.enabled()) {
    // Two-level: every class lives in the one buffer of slabs; a slab's bytes belong to whichever
    // class the manager gave it to, so a slab given to two classes at once would corrupt KV.
    if (plan.arena.buffer_bytes() > (int64_t{1} << 32)) {
      return Status::ResourceExhausted(fmt::format(
          "paged cache: the slabs need {} bytes; plan the tiny model with a smaller budget",
          plan.arena.buffer_bytes()));
    }
    c.buffers_.push_back(AllocateBuffer(plan.arena.buffer_bytes()));
  }
  for (const PageClass& pc : plan.page_classes) {
    if (plan.arena.enabled()) break;
    const int64_t bytes = pc.num_pages * pc.page_bytes;
    if (bytes > (int64_t{1} << 32)) {
      return Status::ResourceExhausted(fmt::format(
          "paged cache: page class {} needs {} bytes; plan the tiny model with a smaller budget",
          pc.id, bytes));
    }
    c.buffers_.push_back(AllocateBuffer(bytes));
  }
  c.group_of_layer_.assign(plan.model.layers.size(), -1);
  c.tensors_.resize(plan.model.layers.size());
  for (const KvGroup& g : plan.groups) {
    for (int32_t l : g.layers)
      c.group_of_layer_[static_cast<size_t>(l)] = g.id;
  }
  for (size_t t = 0; t < plan.layout.tensors.size(); ++t) {
    const TensorView& v = plan.layout.tensors[t];
    if (v.dtype != DType::kFP32) {
      return Status::Unsupported(fmt::format(
          "paged cache: layer {} tensor {} is {}, the reference engine computes in fp32", v.layer,
          v.name, DTypeName(v.dtype)));
    }
    LayerTensors& lt = c.tensors_[static_cast<size_t>(v.layer)];
    if (v.name == "k" || v.name == "latent") lt.k = static_cast<int32_t>(t);
    if (v.name == "v") lt.v = static_cast<int32_t>(t);
    if (v.name == "conv") lt.conv = static_cast<int32_t>(t);
    if (v.name == "ssm") lt.ssm = static_cast<int32_t>(t);
  }
  c.class_tensors_.resize(plan.page_classes.size());
  for (size_t t = 0; t < plan.layout.tensors.size(); ++t) {
    const auto pc = static_cast<size_t>(plan.layout.tensors[t].page_class);
    c.class_tensors_[pc].push_back(static_cast<int32_t>(t));
  }
  c.address_.resize(plan.model.layers.size());
  for (size_t l = 0; l < plan.model.layers.size(); ++l) {
    const LayerTensors& lt = c.tensors_[l];
    const int32_t g = c.group_of_layer_[l];
    if (g < 0 || lt.k < 0) continue;
    const KvGroup& group = plan.groups[static_cast<size_t>(g)];
    RowAddress& a = c.address_[l];
    a.group = g;
    a.encoder = group.rule.kind == TokenRuleKind::kEncoder;
    a.block_tokens = group.block_tokens;
    const auto place = [&](int32_t t, unsigned char*& base, int64_t& stride, int64_t& row) {
      if (t < 0) return;
      const TensorView& v = plan.layout.tensors[static_cast<size_t>(t)];
      base = c.BufferOf(v.page_class) + v.offset;
      stride = v.block_stride;
      row = v.bytes / group.block_tokens;
      if (plan.arena.enabled()) {
        a.pages_per_slab = plan.page_classes[static_cast<size_t>(v.page_class)].pages_per_slab;
        a.slab_bytes = plan.arena.slab_bytes;
      }
    };
    place(lt.k, a.k_base, a.k_stride, a.k_row);
    place(lt.v, a.v_base, a.v_stride, a.v_row);
  }
  return c;
}

void PagedKvCache::ApplyCopies(std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) {
    const KvGroup& g = plan_.groups[static_cast<size_t>(c.group)];
    for (int32_t l : g.layers) {
      for (int32_t t : {tensors_[static_cast<size_t>(l)].k, tensors_[static_cast<size_t>(l)].v}) {
        if (t < 0) continue;
        const TensorView& v = plan_.layout.tensors[static_cast<size_t>(t)];
        std::memmove(BlockOf(t, c.dst), BlockOf(t, c.src), static_cast<size_t>(v.bytes));
      }
    }
  }
}

void PagedKvCache::ApplyMoves(std::span<const PageMove> moves) {
  for (const PageMove& m : moves) {
    for (int32_t t : class_tensors_[static_cast<size_t>(m.pool)]) {
      const TensorView& v = plan_.layout.tensors[static_cast<size_t>(t)];
      std::memcpy(BlockOf(t, m.dst), BlockOf(t, m.src), static_cast<size_t>(v.bytes));
    }
  }
}

Status PagedKvCache::PoisonFreeBlocks(const KvCacheManager& manager) {
  poisoned_.resize(plan_.page_classes.size());
  for (size_t pc = 0; pc < plan_.page_classes.size(); ++pc) {
    std::vector<char>& was = poisoned_[pc];
    // Two-level block ids run 1..num_pages (no page holds the null block).
    const int64_t ids = plan_.page_classes[pc].num_pages + (plan_.arena.enabled() ? 1 : 0);
    was.resize(static_cast<size_t>(ids), 0);
    scratch_blocks_.clear();
    HKV_RETURN_IF_ERROR(
        ManagerProbe::UncachedFreeBlocks(manager, static_cast<int32_t>(pc), scratch_blocks_));
    scratch_flags_.assign(was.size(), 0);
    for (int32_t b : scratch_blocks_) {
      scratch_flags_[static_cast<size_t>(b)] = 1;
      if (was[static_cast<size_t>(b)] != 0) continue;  // still poisoned since the last call
      for (size_t t = 0; t < plan_.layout.tensors.size(); ++t) {
        const TensorView& v = plan_.layout.tensors[t];
        if (static_cast<size_t>(v.page_class) != pc) continue;
        auto* f = reinterpret_cast<float*>(BlockOf(static_cast<int32_t>(t), b));
        std::fill_n(f, v.bytes / static_cast<int64_t>(sizeof(float)),
                    std::numeric_limits<float>::quiet_NaN());
      }
    }
    was.swap(scratch_flags_);
  }
  return Status::Ok();
}

Result<std::unique_ptr<PagedKvCache::StepView>> PagedKvCache::View(const KvCacheManager& manager,
                                                                   RequestId id) {
  HKV_ASSIGN_OR_RETURN(const StepInfo step, manager.Step(id));
  auto view = std::make_unique<StepView>();
  view->cache_ = this;
  view->begin_ = step.begin;
  view->end_ = step.end;
  view->run_encoder_ = step.run_encoder;
  for (const KvGroup& g : plan_.groups) {
    std::span<const int32_t> table;
    std::vector<int64_t> slots;
    if (g.rule.keeps_tokens()) {
      HKV_ASSIGN_OR_RETURN(table, manager.BlockTable(id, g.id));
      if (g.rule.kind != TokenRuleKind::kEncoder) {
        HKV_RETURN_IF_ERROR(manager.SlotMapping(id, g.id, step.begin, step.end, slots));
      }
    }
    view->tables_.push_back(table);
    view->slots_.push_back(std::move(slots));
    StateStep state;
    if (g.rule.kind == TokenRuleKind::kState) {
      HKV_ASSIGN_OR_RETURN(state, manager.State(id, g.id));
      for (int32_t l : g.layers) {
        if (state.read != state.write) CopyState(l, state.read, state.write);
        for (const StateSnapshot& snap : state.snapshots) {
          if (snap.position == step.begin) CopyState(l, state.write, snap.slot);
        }
      }
    }
    view->states_.push_back(state);
  }
  return view;
}

unsigned char* PagedKvCache::BlockOf(int32_t tensor, int32_t block) {
  const TensorView& v = plan_.layout.tensors[static_cast<size_t>(tensor)];
  return BufferOf(v.page_class) + plan_.BlockOffset(v, block);
}

// Copies one layer's state tensors between state blocks; block 0 (null) is the zero state.
void PagedKvCache::CopyState(int32_t layer, int32_t from, int32_t to) {
  const LayerTensors& lt = tensors_[static_cast<size_t>(layer)];
  for (int32_t t : {lt.conv, lt.ssm}) {
    if (t < 0) continue;
    const auto bytes = static_cast<size_t>(plan_.layout.tensors[static_cast<size_t>(t)].bytes);
    if (from == BlockPool::kNullBlock) {
      std::memset(BlockOf(t, to), 0, bytes);
    } else {
      std::memmove(BlockOf(t, to), BlockOf(t, from), bytes);
    }
  }
}

float* PagedKvCache::StepView::State(int32_t layer, int which) {
  PagedKvCache& c = *cache_;
  const int32_t g = c.group_of_layer_[static_cast<size_t>(layer)];
  const LayerTensors& lt = c.tensors_[static_cast<size_t>(layer)];
  const int32_t t = which == 0 ? lt.conv : lt.ssm;
  if (g < 0 || t < 0) {
    if (status_.ok()) {
      status_ = Status::FailedPrecondition(
          fmt::format("paged cache: layer {} has no state tensor {}", layer, which));
    }
    scratch_.assign(1 << 16, 0.0f);
    return scratch_.data();
  }
  return reinterpret_cast<float*>(c.BlockOf(t, states_[static_cast<size_t>(g)].write));
}

void PagedKvCache::StepView::AfterPosition(int32_t layer, int64_t position) {
  PagedKvCache& c = *cache_;
  const int32_t g = c.group_of_layer_[static_cast<size_t>(layer)];
  if (g < 0) return;
  const StateStep& st = states_[static_cast<size_t>(g)];
  for (const StateSnapshot& snap : st.snapshots) {
    if (snap.position == position) c.CopyState(layer, st.write, snap.slot);
  }
}

KvRows PagedKvCache::StepView::Fail(int32_t layer, int64_t pos, std::string why) {
  if (status_.ok()) {
    status_ = Status::FailedPrecondition(
        fmt::format("paged cache: layer {} position {}: {}", layer, pos, why));
  }
  // NaN rows let the pass finish without touching anybody's memory; the status reports it.
  scratch_.assign(4096, std::numeric_limits<float>::quiet_NaN());
  return {scratch_.data(), scratch_.data(), 1};
}

void PagedKvCache::StepView::SetSlots(int32_t layer, const SlotView* view) {
  sparse_.resize(cache_->address_.size(), nullptr);
  sparse_[static_cast<size_t>(layer)] = view;
}

const SlotView* PagedKvCache::StepView::Slots(int32_t layer) {
  return static_cast<size_t>(layer) < sparse_.size() ? sparse_[static_cast<size_t>(layer)]
                                                     : nullptr;
}

KvRows PagedKvCache::StepView::Rows(int32_t layer, int64_t pos) {
  const RowAddress& a = cache_->address_[static_cast<size_t>(layer)];
  if (a.group < 0) return Fail(layer, pos, "the layer owns no cache tensor");
  const int64_t bs = a.block_tokens;
  int64_t block = 0, offset = 0, n = 0;
  if (const SlotView* sv = Slots(layer); sv != nullptr) {
    // A sparse layer's table indexes slots, the step's own included (Evict, SlotMapping).
    const auto& table = tables_[static_cast<size_t>(a.group)];
    const auto slots = static_cast<int64_t>(sv->positions.size());
    if (pos < 0 || pos >= slots || pos / bs >= static_cast<int64_t>(table.size())) {
      return Fail(layer, pos, "slot outside the sparse layer's table");
    }
    block = table[static_cast<size_t>(pos / bs)];
    offset = pos % bs;
    n = std::min(bs - offset, slots - pos);
  } else if (!a.encoder && pos >= begin_ && pos < end_) {
    // The step's own positions: where SlotMapping put them.
    const int64_t slot = slots_[static_cast<size_t>(a.group)][static_cast<size_t>(pos - begin_)];
    block = slot / bs;
    offset = slot % bs;
    n = std::min(bs - offset, end_ - pos);
  } else {
    const auto& table = tables_[static_cast<size_t>(a.group)];
    if (pos < 0 || pos / bs >= static_cast<int64_t>(table.size())) {
      return Fail(layer, pos, "outside the block table");
    }
    block = table[static_cast<size_t>(pos / bs)];
    offset = pos % bs;
    n = bs - offset;
    if (!a.encoder && pos < begin_) n = std::min(n, begin_ - pos);
    if (block == BlockPool::kNullBlock) {
      return Fail(layer, pos, "the block table holds the null block");
    }
  }
  float* k = reinterpret_cast<float*>(a.Block(a.k_base, a.k_stride, block) + offset * a.k_row);
  float* v =
      a.v_base == nullptr
          ? nullptr
          : reinterpret_cast<float*>(a.Block(a.v_base, a.v_stride, block) + offset * a.v_row);
  return {k, v, n};
}

void PagedKvCache::MoveSlots(int32_t layer, std::span<const int32_t> old_table,
                             std::span<const int32_t> new_table, std::span<const int32_t> keep,
                             int64_t from) {
  const RowAddress& a = address_[static_cast<size_t>(layer)];
  const int64_t bs = a.block_tokens;
  const auto row = [&](unsigned char* base, int64_t stride, int64_t width,
                       std::span<const int32_t> table, int64_t slot) {
    return a.Block(base, stride, table[static_cast<size_t>(slot / bs)]) + (slot % bs) * width;
  };
  for (auto s = static_cast<size_t>(from); s < keep.size(); ++s) {
    const int64_t src = keep[s];
    const auto dst = static_cast<int64_t>(s);
    unsigned char* to = row(a.k_base, a.k_stride, a.k_row, new_table, dst);
    unsigned char* fro = row(a.k_base, a.k_stride, a.k_row, old_table, src);
    if (to != fro) std::memmove(to, fro, static_cast<size_t>(a.k_row));
    if (a.v_base == nullptr) continue;
    to = row(a.v_base, a.v_stride, a.v_row, new_table, dst);
    fro = row(a.v_base, a.v_stride, a.v_row, old_table, src);
    if (to != fro) std::memmove(to, fro, static_cast<size_t>(a.v_row));
  }
}

}  // namespace hkv
