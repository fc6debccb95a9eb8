#include <cstring>
#include <limits>

#include <fmt/format.h>

#include <hkv/engine/paged_kv_cache.h>

namespace hkv {

PagedKvCache::PagedKvCache(const Plan& plan) : plan_(plan) {}

Result<PagedKvCache> PagedKvCache::Create(const Plan& plan) {
  PagedKvCache c(plan);
  for (const PageClass& pc : plan.page_classes) {
    const int64_t bytes = pc.num_pages * pc.page_bytes;
    if (bytes > (int64_t{1} << 32)) {
      return Status::ResourceExhausted(fmt::format(
          "paged cache: page class {} needs {} bytes; plan the tiny model with a smaller budget",
          pc.id, bytes));
    }
    c.buffers_.emplace_back(static_cast<size_t>(bytes));
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
  return c;
}

void PagedKvCache::ApplyCopies(std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) {
    const KvGroup& g = plan_.groups[static_cast<size_t>(c.group)];
    for (int32_t l : g.layers) {
      for (int32_t t : {tensors_[static_cast<size_t>(l)].k, tensors_[static_cast<size_t>(l)].v}) {
        if (t < 0) continue;
        const TensorView& v = plan_.layout.tensors[static_cast<size_t>(t)];
        unsigned char* base = buffers_[static_cast<size_t>(v.page_class)].data() + v.offset;
        std::memmove(base + c.dst * v.block_stride, base + c.src * v.block_stride,
                     static_cast<size_t>(v.bytes));
      }
    }
  }
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
  return buffers_[static_cast<size_t>(v.page_class)].data() + v.offset + block * v.block_stride;
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

KvRows PagedKvCache::StepView::Rows(int32_t layer, int64_t pos) {
  const PagedKvCache& c = *cache_;
  const int32_t g = c.group_of_layer_[static_cast<size_t>(layer)];
  const LayerTensors& lt = c.tensors_[static_cast<size_t>(layer)];
  if (g < 0 || lt.k < 0) return Fail(layer, pos, "the layer owns no cache tensor");
  const KvGroup& group = c.plan_.groups[static_cast<size_t>(g)];
  const int64_t bs = group.block_tokens;
  const bool encoder = group.rule.kind == TokenRuleKind::kEncoder;
  int64_t block = 0, offset = 0, n = 0;
  if (!encoder && pos >= begin_ && pos < end_) {
    // The step's own positions: where SlotMapping put them.
    const auto& slots = slots_[static_cast<size_t>(g)];
    const int64_t slot = slots[static_cast<size_t>(pos - begin_)];
    block = slot / bs;
    offset = slot % bs;
    n = std::min(bs - offset, end_ - pos);
  } else {
    const auto& table = tables_[static_cast<size_t>(g)];
    if (pos < 0 || pos / bs >= static_cast<int64_t>(table.size())) {
      return Fail(layer, pos, "outside the block table");
    }
    block = table[static_cast<size_t>(pos / bs)];
    offset = pos % bs;
    n = bs - offset;
    if (!encoder && pos < begin_) n = std::min(n, begin_ - pos);
    if (block == BlockPool::kNullBlock)
      return Fail(layer, pos, "the block table holds the null block");
  }
  const auto row = [&](int32_t t) -> float* {
    if (t < 0) return nullptr;
    const TensorView& v = c.plan_.layout.tensors[static_cast<size_t>(t)];
    unsigned char* p = cache_->buffers_[static_cast<size_t>(v.page_class)].data() + v.offset +
                       block * v.block_stride + offset * (v.bytes / bs);
    return reinterpret_cast<float*>(p);
  };
  return {row(lt.k), row(lt.v), n};
}

}  // namespace hkv
