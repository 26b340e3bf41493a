#include "policies/rollout/kv_block_pool.h"

#include <algorithm>
#include <cmath>

#include "policies/rollout/paged_attention.h"

namespace strata::policies {

KvBlockPool::KvBlockPool(const LlamaConfig& config, int64_t num_blocks, int64_t block_tokens, at::TensorOptions options)
    : block_tokens_(block_tokens), references_(static_cast<size_t>(num_blocks), 0) {
  TORCH_CHECK(num_blocks >= 0 && block_tokens >= 1, "KV pool of ", num_blocks, " blocks of ", block_tokens, " tokens");
  const int64_t slots = num_blocks * block_tokens + 1;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    for (auto* store : {&keys_, &values_}) {
      // Only the scratch row is ever read before it is written.
      at::Tensor t = at::empty({slots, config.num_key_value_heads, config.head_dim}, options);
      t.select(0, slots - 1).zero_();
      store->push_back(std::move(t));
    }
  }
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int64_t KvBlockPool::BlockBytes(const LlamaConfig& config, int64_t block_tokens, at::ScalarType dtype) {
  return 2 * config.num_hidden_layers * block_tokens * config.num_key_value_heads * config.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t KvBlockPool::Allocate() {
  if (free_.empty()) return -1;
  const int64_t block = free_.back();
  free_.pop_back();
  references_[static_cast<size_t>(block)] = 1;
  peak_used_ = std::max(peak_used_, used_blocks());
  return block;
}

void KvBlockPool::AddReference(int64_t block) {
  TORCH_CHECK(references_[static_cast<size_t>(block)] > 0, "KV block ", block, " is free");
  ++references_[static_cast<size_t>(block)];
}

void KvBlockPool::Release(int64_t block) {
  int32_t& count = references_[static_cast<size_t>(block)];
  TORCH_CHECK(count > 0, "KV block ", block, " released more often than held");
  if (--count == 0) free_.push_back(block);
}

void KvBlockPool::CopyPositions(int64_t from, int64_t to, int64_t positions) {
  if (positions <= 0) return;
  for (auto* store : {&keys_, &values_}) {
    for (at::Tensor& t : *store) {
      t.narrow(0, to * block_tokens_, positions).copy_(t.narrow(0, from * block_tokens_, positions));
    }
  }
}

void KvBlockPool::FillRow(const std::vector<int64_t>& table, int64_t positions, int64_t columns, int64_t* slots,
                          int64_t* mask) const {
  TORCH_CHECK(positions <= columns, "a sequence of ", positions, " positions in ", columns, " columns");
  const int64_t offset = columns - positions;
  std::fill(slots, slots + offset, scratch_slot());
  std::fill(mask, mask + offset, 0);
  for (int64_t j = 0; j < positions; ++j) slots[offset + j] = Slot(table, j), mask[offset + j] = 1;
}

PagedKvView::PagedKvView(KvBlockPool& pool, int64_t rows, int64_t columns, int64_t new_tokens)
    : pool_(pool), rows_(rows), columns_(columns), cached_(columns - new_tokens) {
  TORCH_CHECK(new_tokens >= 1 && new_tokens <= columns_, "a paged pass of ", new_tokens, " new tokens over ", columns_,
              " columns");
}

PagedKvView::PagedKvView(KvBlockPool& pool, at::Tensor slots, int64_t new_tokens)
    : PagedKvView(pool, slots.size(0), slots.size(1), new_tokens) {
  host_slots_ = slots.contiguous();
  const at::Device device = pool.keys(0).device();
  const at::Tensor on_device = host_slots_.to(device);
  all_slots_ = on_device.reshape({-1});
  new_slots_ = on_device.narrow(1, cached_, new_tokens).reshape({-1});
  const int64_t* s = host_slots_.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows_; ++b) {
    int64_t c = 0;
    while (c < columns_ && s[b * columns_ + c] == pool.scratch_slot()) ++c;
    first_.push_back(c);
  }
}

PagedKvView PagedKvView::OnDevice(KvBlockPool& pool, const at::Tensor& device_slots, int64_t new_tokens) {
  TORCH_CHECK(device_slots.device() == pool.keys(0).device(), "paged view: slots on ", device_slots.device(),
              ", the pool on ", pool.keys(0).device());
  PagedKvView view(pool, device_slots.size(0), device_slots.size(1), new_tokens);
  view.all_slots_ = device_slots.reshape({-1});
  view.new_slots_ = device_slots.narrow(1, view.cached_, new_tokens).reshape({-1});
  return view;
}

void PagedKvView::Store(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  const int64_t n_kv = k.size(1), d = k.size(3), t = k.size(2);
  auto rows_of = [&](const at::Tensor& x) { return x.permute({0, 2, 1, 3}).reshape({rows_ * t, n_kv, d}); };
  // Padding rows all land on the scratch slot; which of them stays there
  // does not matter, it is masked.
  pool_.keys(layer).index_copy_(0, new_slots_, rows_of(k));
  pool_.values(layer).index_copy_(0, new_slots_, rows_of(v));
}

std::pair<at::Tensor, at::Tensor> PagedKvView::Append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  Store(layer, k, v);
  if (cached_ == 0) return {k, v};  // a prefill attends over its own tokens only
  const int64_t n_kv = k.size(1), d = k.size(3);
  auto gathered = [&](const at::Tensor& store) {
    return store.index_select(0, all_slots_).view({rows_, columns_, n_kv, d}).permute({0, 2, 1, 3});
  };
  return {gathered(pool_.keys(layer)), gathered(pool_.values(layer))};
}

at::Tensor PagedKvView::AppendAndAttend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        int64_t sliding_window) {
  // One new token per row, after some cached ones, on the CPU: attend
  // where the blocks lie. Anything else gathers.
  if (!host_slots_.defined() || cached_ == 0 || q.size(2) != 1 || !q.device().is_cpu() ||
      (q.scalar_type() != at::kFloat && q.scalar_type() != at::kBFloat16)) {
    return at::Tensor();
  }
  Store(layer, k, v);
  const int64_t d = q.size(3);
  const at::Tensor out = PagedDecodeAttention(q.select(2, 0), pool_.keys(layer), pool_.values(layer),
                                              host_slots_.data_ptr<int64_t>(), first_, columns_,
                                              1.0 / std::sqrt(static_cast<double>(d)), sliding_window);
  return out.to(q.scalar_type()).view({rows_, 1, -1});
}

}  // namespace strata::policies
