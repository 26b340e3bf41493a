// A checkpoint's state.json: what resume reads back. Free of torch, so the
// fuzz target for it builds with any compiler.
#ifndef STRATA_SERVICES_RANK_CHECKPOINT_STATE_H_
#define STRATA_SERVICES_RANK_CHECKPOINT_STATE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace strata::services {

// What a checkpoint's state.json says (JobRank::Commit writes it).
struct CheckpointState {
  int64_t metrics_lines = 0;  // lines of metrics.jsonl the checkpoint follows
  std::string run_id;         // the job that wrote it ("" before job ids)
  std::map<std::string, double> algorithm;  // the driver's saved scalars
};
// Parses the state.json of checkpoint `dir`, written after `iteration`
// iterations. DATA_LOSS naming the file and field for malformed JSON, wrong
// types, or counts that do not fit the iteration.
absl::StatusOr<CheckpointState> ParseCheckpointState(const std::string& text, const std::string& dir,
                                                     int64_t iteration);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_CHECKPOINT_STATE_H_
