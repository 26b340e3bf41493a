#include "services/rank/gang_sum.h"

#include <algorithm>

#include "base/status_macros.h"

namespace strata::services {

absl::Status SumOverGang(policies::ProcessGroup& gang, std::vector<double>& values) {
  if (gang.world_size() == 1 || values.empty()) return absl::OkStatus();
  std::vector<at::Tensor> t = {at::tensor(values, at::kDouble)};
  STRATA_RETURN_IF_ERROR(gang.AllReduceSum(t));
  const double* v = t[0].data_ptr<double>();
  values.assign(v, v + values.size());
  return absl::OkStatus();
}

MicroBatchRanges MicroBatches(size_t rows, int64_t micro_batch_size) {
  const size_t size = micro_batch_size > 0 ? static_cast<size_t>(micro_batch_size) : std::max<size_t>(rows, 1);
  MicroBatchRanges out;
  for (size_t begin = 0; begin < rows; begin += size) out.emplace_back(begin, std::min(rows, begin + size));
  if (out.empty()) out.emplace_back(0, 0);
  return out;
}

absl::StatusOr<std::vector<MicroBatchRanges>> GangMicroBatches(policies::ProcessGroup& gang,
                                                               const std::vector<size_t>& rows_per_step,
                                                               int64_t micro_batch_size) {
  std::vector<MicroBatchRanges> out;
  for (size_t rows : rows_per_step) out.push_back(MicroBatches(rows, micro_batch_size));
  const size_t world = static_cast<size_t>(gang.world_size()), steps = out.size();
  if (world == 1 || micro_batch_size <= 0 || steps == 0) return out;
  // Every rank's counts in one sum: rank r's at [r * steps, (r + 1) * steps).
  std::vector<double> counts(world * steps, 0.0);
  const size_t rank = static_cast<size_t>(gang.rank());
  for (size_t k = 0; k < steps; ++k) counts[rank * steps + k] = static_cast<double>(out[k].size());
  STRATA_RETURN_IF_ERROR(SumOverGang(gang, counts));
  for (size_t k = 0; k < steps; ++k) {
    size_t most = 0;
    for (size_t r = 0; r < world; ++r) most = std::max(most, static_cast<size_t>(counts[r * steps + k]));
    while (out[k].size() < most) out[k].emplace_back(rows_per_step[k], rows_per_step[k]);
  }
  return out;
}

}  // namespace strata::services
