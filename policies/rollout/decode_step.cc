#include "policies/rollout/decode_step.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace strata::policies {

namespace {

// A staged row: its token, its draw's seed and step, whether it is greedy,
// then `columns` KV slots and `columns` attention mask bits.
enum StagedColumn : int64_t { kToken, kSeed, kStep, kGreedy, kSlots };

}  // namespace

DecodeStep::DecodeStep(const LlamaModel& model, KvBlockPool& pool, const SamplingOptions& sampling, int64_t rows,
                       int64_t columns)
    : model_(model), pool_(pool), sampling_(sampling), rows_(rows), columns_(columns) {
  // One column would make the step's attention causal-alone, which the
  // fused kernel's setup checks on the host.
  TORCH_CHECK(rows >= 1 && columns >= 2, "decode step of ", rows, " rows x ", columns, " columns");
  const at::Device device = model.device();
  staged_ = at::zeros({rows, kSlots + 2 * columns},
                      at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  inputs_ = at::zeros_like(staged_, at::TensorOptions().device(device).pinned_memory(false));
  picks_ = at::zeros({3, rows}, at::TensorOptions().dtype(at::kDouble).device(device));
}

void DecodeStep::Stage(const std::vector<StepRow>& batch) {
  TORCH_CHECK(static_cast<int64_t>(batch.size()) <= rows_, "decode step: ", batch.size(), " rows for a bucket of ",
              rows_);
  const int64_t width = kSlots + 2 * columns_;
  int64_t* row = staged_.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows_; ++r, row += width) {
    int64_t* slots = row + kSlots;
    int64_t* mask = slots + columns_;
    if (r >= static_cast<int64_t>(batch.size())) {
      // A pad row: a pad token at the scratch slot, attending to itself.
      row[kToken] = model_.config().PadId(), row[kSeed] = 0, row[kStep] = 0, row[kGreedy] = 1;
      std::fill(slots, slots + columns_, pool_.scratch_slot());
      std::fill(mask, mask + columns_ - 1, 0);
      mask[columns_ - 1] = 1;
      continue;
    }
    const StepRow& s = batch[static_cast<size_t>(r)];
    row[kToken] = s.token;
    row[kSeed] = s.draw ? static_cast<int64_t>(s.draw->seed) : 0;
    row[kStep] = s.draw ? s.draw->step : 0;
    row[kGreedy] = s.draw ? 0 : 1;
    pool_.FillRow(*s.table, s.cached + 1, columns_, slots, mask);
  }
  inputs_.copy_(staged_, /*non_blocking=*/true);
}

void DecodeStep::Compute() {
  const at::Tensor ids = inputs_.narrow(1, kToken, 1);
  const at::Tensor keys = inputs_.narrow(1, kSeed, 2);  // seed, step
  const at::Tensor greedy = inputs_.select(1, kGreedy).to(at::kBool);
  const at::Tensor slots = inputs_.narrow(1, kSlots, columns_);
  const at::Tensor mask = inputs_.narrow(1, kSlots + columns_, columns_);
  PagedKvView view = PagedKvView::OnDevice(pool_, slots, /*new_tokens=*/1);
  const at::Tensor hidden = model_.Hidden(ids, mask, &view);
  picks_.copy_(PickOnDevice(model_.LogitsFromHidden(hidden.select(1, 0)), sampling_, keys, greedy));
}

void DecodeStep::Run(GraphSession* graphs) {
  ++runs_;
  if (graph_ != nullptr) {
    graph_->Replay();
    return;
  }
  if (graphs == nullptr || runs_ == 1) {
    Compute();
    return;
  }
  TORCH_CHECK(!model_.streams_layers(), "decode step: a model that streams its layers cannot be captured");
  graph_ = graphs->Capture([this] { Compute(); });
  graph_->Replay();
}

SampledTokens DecodeStep::Fetch(int64_t n) const {
  TORCH_CHECK(n >= 0 && n <= rows_, "decode step: fetching ", n, " of ", rows_, " rows");
  return TokensFromPicks(picks_.narrow(1, 0, n));
}

}  // namespace strata::policies
