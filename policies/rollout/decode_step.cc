#include "policies/rollout/decode_step.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace strata::policies {

namespace {

// Columns of a staged row before its slots: token, seed, step, greedy.
constexpr int64_t kHead = 4;

}  // namespace

int64_t RowBucket(int64_t rows) {
  if (rows <= 1) return 1;
  if (rows <= 8) {
    int64_t bucket = 2;
    while (bucket < rows) bucket *= 2;
    return bucket;
  }
  return (rows + 7) / 8 * 8;
}

int64_t ColumnBucket(int64_t positions, int64_t block_tokens, int64_t max_columns) {
  int64_t blocks = 1;
  while (blocks * block_tokens < positions) blocks *= 2;
  return std::max(positions, std::min(blocks * block_tokens, max_columns));
}

DecodeStep::DecodeStep(const LlamaModel& model, KvBlockPool& pool, const SamplingOptions& sampling, int64_t rows,
                       int64_t columns)
    : model_(model), pool_(pool), sampling_(sampling), rows_(rows), columns_(columns) {
  TORCH_CHECK(rows >= 1 && columns >= 1, "decode step of ", rows, " rows x ", columns, " columns");
  const at::Device device = model.device();
  staged_ = at::zeros({rows, kHead + 2 * columns},
                      at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  inputs_ = at::zeros_like(staged_, at::TensorOptions().device(device).pinned_memory(false));
  picks_ = at::zeros({3, rows}, at::TensorOptions().dtype(at::kDouble).device(device));
}

void DecodeStep::Stage(const std::vector<StepRow>& batch) {
  TORCH_CHECK(static_cast<int64_t>(batch.size()) <= rows_, "decode step: ", batch.size(), " rows for a bucket of ",
              rows_);
  const int64_t pad = model_.config().pad_token_id >= 0 ? model_.config().pad_token_id : 0;
  const int64_t width = kHead + 2 * columns_, scratch = pool_.scratch_slot();
  int64_t* row = staged_.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows_; ++r, row += width) {
    int64_t* slots = row + kHead;
    int64_t* mask = slots + columns_;
    std::fill(slots, slots + columns_, scratch);
    std::fill(mask, mask + columns_, 0);
    if (r >= static_cast<int64_t>(batch.size())) {
      // A pad row: a pad token at the scratch slot, attending to itself.
      row[0] = pad, row[1] = 0, row[2] = 0, row[3] = 1;
      mask[columns_ - 1] = 1;
      continue;
    }
    const StepRow& s = batch[static_cast<size_t>(r)];
    TORCH_CHECK(s.cached + 1 <= columns_, "decode step: a sequence of ", s.cached + 1, " positions in ", columns_,
                " columns");
    row[0] = s.token;
    row[1] = s.draw ? static_cast<int64_t>(s.draw->seed) : 0;
    row[2] = s.draw ? s.draw->step : 0;
    row[3] = s.draw ? 0 : 1;
    // Left padded, as the engine's exact steps are: the new position last.
    const int64_t offset = columns_ - 1 - s.cached;
    for (int64_t j = 0; j <= s.cached; ++j) slots[offset + j] = pool_.Slot(*s.table, j), mask[offset + j] = 1;
  }
  inputs_.copy_(staged_, /*non_blocking=*/true);
}

void DecodeStep::Compute() {
  const at::Tensor ids = inputs_.narrow(1, 0, 1);
  const at::Tensor keys = inputs_.narrow(1, 1, 2);
  const at::Tensor greedy = inputs_.select(1, 3).to(at::kBool);
  const at::Tensor slots = inputs_.narrow(1, kHead, columns_);
  const at::Tensor mask = inputs_.narrow(1, kHead + columns_, columns_);
  PagedKvView view = PagedKvView::OnDevice(pool_, slots, /*new_tokens=*/1);
  const at::Tensor hidden = model_.Hidden(ids, mask, &view);
  picks_.copy_(PickOnDevice(model_.LogitsFromHidden(hidden.select(1, 0)), sampling_, keys, greedy));
}

void DecodeStep::Run(GraphSession* graphs) {
  if (graph_ != nullptr) {
    graph_->Replay();
    return;
  }
  Compute();
  if (graphs != nullptr) graph_ = graphs->Capture([this] { Compute(); });
}

SampledTokens DecodeStep::Fetch(int64_t n) const {
  TORCH_CHECK(n >= 0 && n <= rows_, "decode step: fetching ", n, " of ", rows_, " rows");
  return TokensFromPicks(picks_.narrow(1, 0, n));
}

}  // namespace strata::policies
