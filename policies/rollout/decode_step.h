// One decoding step of the rollout engine in buffers of a fixed shape, so
// that a CUDA graph can capture it once and replay it every step after.
//
// A step's shape is a bucket: rows (the running sequences, rounded up with
// pad rows) by columns (the longest sequence's positions, rounded up to a
// power of two of KV blocks). Its inputs (each row's token, KV slots,
// mask, draw key and kind) reach the device in one copy; the model and the
// sampler then run over the buffers without reading anything on the host
// or copying anything from it (Compute); the picks come back in one copy.
// Pad rows decode a pad token that attends only to itself at the pool's
// scratch slot, so they stay finite, and no real row sees them.
#ifndef STRATA_POLICIES_ROLLOUT_DECODE_STEP_H_
#define STRATA_POLICIES_ROLLOUT_DECODE_STEP_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "policies/config/rollout_options.h"
#include "policies/config/sampling.h"
#include "policies/model/llama.h"
#include "policies/model/sampler.h"
#include "policies/rollout/captured_graph.h"
#include "policies/rollout/kv_block_pool.h"

namespace strata::policies {

// One running sequence's part of a step.
struct StepRow {
  int32_t token = 0;                            // its last token, not yet cached
  const std::vector<int64_t>* table = nullptr;  // its KV blocks, the new position's included
  int64_t cached = 0;                           // positions already in the pool
  std::optional<RowDraw> draw;                  // sampled; greedy without
};

class DecodeStep {
 public:
  // Buffers for a bucket of `rows` x `columns` on the model's device. The
  // model and the pool outlive the step.
  DecodeStep(const LlamaModel& model, KvBlockPool& pool, const SamplingOptions& sampling, int64_t rows,
             int64_t columns);

  int64_t rows() const { return rows_; }
  int64_t columns() const { return columns_; }

  // Writes `batch` (at most rows() sequences, each with cached + 1 <=
  // columns()) into the step's inputs: one copy to the device, from a
  // pinned buffer that the next Stage rewrites only after Fetch has waited
  // for the step.
  void Stage(const std::vector<StepRow>& batch);
  // The model and the sampler over the staged inputs, into the step's
  // picks: reads nothing on the host, copies nothing from it and allocates
  // only shapes the bucket fixes. This is the work a graph captures.
  void Compute();
  // Compute without `graphs`. With them, the first call computes (warming
  // up what capture needs: libraries' workspaces on the session's stream),
  // the second captures Compute and replays it, and later calls replay: a
  // bucket used once costs no capture. A model that streams its layers
  // cannot be captured.
  void Run(GraphSession* graphs);
  bool captured() const { return graph_ != nullptr; }
  // The picks of the first `n` rows, in one copy to the host; a sampled
  // row whose logits were not finite is an error, as SampleNextTokens has.
  SampledTokens Fetch(int64_t n) const;

 private:
  const LlamaModel& model_;
  KvBlockPool& pool_;
  const SamplingOptions sampling_;
  const int64_t rows_, columns_;
  int64_t runs_ = 0;
  at::Tensor staged_;  // [rows, kSlots + 2 columns] int64 on the host (pinned for a CUDA device)
  at::Tensor inputs_;  // the same on the device
  at::Tensor picks_;   // [3, rows] float64 on the device (PickOnDevice)
  std::unique_ptr<CapturedGraph> graph_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_ROLLOUT_DECODE_STEP_H_
