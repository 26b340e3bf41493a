// A checkpoint's state.json, both ways: what a commit writes and resume
// reads back (run_checkpoint.h owns the file's name and place). Free of
// torch, so the fuzz target for it builds with any compiler.
#ifndef STRATA_SERVICES_RANK_CHECKPOINT_STATE_H_
#define STRATA_SERVICES_RANK_CHECKPOINT_STATE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace strata::services {

// What a checkpoint's state.json says.
struct CheckpointState {
  int64_t metrics_lines = 0;                // lines of metrics.jsonl the checkpoint follows
  std::string run_id;                       // the job that wrote it ("" before job ids)
  std::map<std::string, double> algorithm;  // the driver's saved scalars
};
// Parses the state.json of checkpoint `dir`, written after `iteration`
// iterations. DATA_LOSS naming the file and field for malformed JSON, wrong
// types, or counts that do not fit the iteration.
absl::StatusOr<CheckpointState> ParseCheckpointState(const std::string& text, const std::string& dir,
                                                     int64_t iteration);
// The state.json of the checkpoint after `iteration` iterations, written by
// a gang of `world_size` ranks.
std::string SerializeCheckpointState(const CheckpointState& state, int64_t iteration, int world_size);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_CHECKPOINT_STATE_H_
