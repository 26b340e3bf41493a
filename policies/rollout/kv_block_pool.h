// The KV cache of a rollout as fixed-size blocks from one pool. A block
// holds `block_tokens` positions of one sequence, every layer's keys and
// values; a sequence holds a table of blocks (position p lives in block
// table[p / block_tokens]), so no sequence is padded to another's length.
// Blocks are counted by reference: a prompt's continuations hold the
// prompt's full blocks together, each its own copy of the block it writes.
#ifndef STRATA_POLICIES_ROLLOUT_KV_BLOCK_POOL_H_
#define STRATA_POLICIES_ROLLOUT_KV_BLOCK_POOL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "policies/config/llama_config.h"
#include "policies/model/llama.h"

namespace strata::policies {

class KvBlockPool {
 public:
  // Storage for `num_blocks` blocks on `options`' device, in its dtype.
  KvBlockPool(const LlamaConfig& config, int64_t num_blocks, int64_t block_tokens, at::TensorOptions options);
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  // Bytes of one block: keys and values of every layer.
  static int64_t BlockBytes(const LlamaConfig& config, int64_t block_tokens, at::ScalarType dtype);

  int64_t num_blocks() const { return static_cast<int64_t>(references_.size()); }
  int64_t block_tokens() const { return block_tokens_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks() - free_blocks(); }
  int64_t peak_used_blocks() const { return peak_used_; }

  // A free block holding one reference; -1 when none is left.
  int64_t Allocate();
  // Another holder of `block` (a continuation sharing a prompt's block).
  void AddReference(int64_t block);
  // Drops one reference; the block is free again when none is left.
  void Release(int64_t block);
  int64_t references(int64_t block) const { return references_[static_cast<size_t>(block)]; }

  // Copies the first `positions` positions of block `from` into block `to`,
  // every layer (copy on write: a continuation's own copy of a prompt's
  // partly filled last block).
  void CopyPositions(int64_t from, int64_t to, int64_t positions);

  // The row of keys(layer) holding position `position` of a sequence whose
  // blocks are `table`.
  int64_t Slot(const std::vector<int64_t>& table, int64_t position) const {
    return table[static_cast<size_t>(position / block_tokens_)] * block_tokens_ + position % block_tokens_;
  }
  // A row no block owns: padding writes there and reads from there, always
  // masked out of attention. It starts at zero, never NaN.
  int64_t scratch_slot() const { return num_blocks() * block_tokens_; }
  // One row of a pass's slots and attention mask (`columns` entries each)
  // for a sequence whose first `positions` positions lie in `table`: left
  // padded, as the model's masks have it, padding at the scratch slot.
  void FillRow(const std::vector<int64_t>& table, int64_t positions, int64_t columns, int64_t* slots,
               int64_t* mask) const;

  // [num_blocks x block_tokens + 1 scratch, n_kv, d] per layer.
  at::Tensor& keys(int64_t layer) { return keys_[static_cast<size_t>(layer)]; }
  at::Tensor& values(int64_t layer) { return values_[static_cast<size_t>(layer)]; }

 private:
  int64_t block_tokens_;
  std::vector<at::Tensor> keys_, values_;
  std::vector<int32_t> references_;
  std::vector<int64_t> free_;  // a stack: the most recently freed block is reused first
  int64_t peak_used_ = 0;
};

// One forward pass's view of the pool, as the model's layers see a cache:
// row b's columns are the slots `slots[b]` ([B, S] int64 on the CPU;
// padding at the scratch slot, left of the real positions, as the attention
// mask has it), of which the last `new_tokens` are written by this pass. A
// decode step on the CPU attends where the blocks lie (PagedDecodeAttention);
// elsewhere the layer attends over a gathered copy.
class PagedKvView final : public KvCache {
 public:
  PagedKvView(KvBlockPool& pool, at::Tensor slots, int64_t new_tokens);
  // A view whose slots are already on the pool's device, read by no host
  // code: it always attends over a gathered copy, and a CUDA graph can
  // capture the pass (policies/rollout/decode_step.h).
  static PagedKvView OnDevice(KvBlockPool& pool, const at::Tensor& device_slots, int64_t new_tokens);

  int64_t length() const override { return cached_; }
  std::pair<at::Tensor, at::Tensor> Append(int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  void Advance(int64_t /*tokens*/) override {}  // the engine keeps each sequence's length
  at::Tensor AppendAndAttend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             int64_t sliding_window) override;

 private:
  PagedKvView(KvBlockPool& pool, int64_t rows, int64_t columns, int64_t new_tokens);
  void Store(int64_t layer, const at::Tensor& k, const at::Tensor& v);

  KvBlockPool& pool_;
  int64_t rows_, columns_, cached_;
  at::Tensor host_slots_;       // [B, S] on the CPU; undefined OnDevice
  at::Tensor all_slots_;        // [B x S] on the pool's device
  at::Tensor new_slots_;        // [B x T] on the pool's device
  std::vector<int64_t> first_;  // each row's first real column
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_ROLLOUT_KV_BLOCK_POOL_H_
