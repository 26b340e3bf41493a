// A run's checkpoints under checkpoint.dir: every name in that directory and
// how a gang writes one so that a crash at any point leaves either the whole
// checkpoint or nothing that passes for one. The layout is written at the
// top of run_checkpoint.cc; state.json's contents are checkpoint_state.h's.
#ifndef STRATA_SERVICES_RANK_RUN_CHECKPOINT_H_
#define STRATA_SERVICES_RANK_RUN_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/dist/process_group.h"
#include "services/rank/checkpoint_state.h"

namespace strata::services {

// The newest complete checkpoint under `dir` ("" if none, or no `dir`) and
// its iteration; an error naming `dir` when it cannot be read.
absl::StatusOr<std::pair<std::string, int64_t>> LatestCheckpoint(const std::string& dir);
// Removes every checkpoint under `dir` (complete or not); what is not a
// checkpoint stays.
absl::Status RemoveCheckpoints(const std::string& dir);
// The state.json of checkpoint `dir`, written after `iteration` iterations
// (ParseCheckpointState's errors, or the file's).
absl::StatusOr<CheckpointState> ReadCheckpointState(const std::string& dir, int64_t iteration);

// Where a trained model's part of checkpoint `dir` lies (`model`: the
// model's name, "actor", "critic" or "reward").
std::string ModelCheckpointDirectory(const std::string& dir, const std::string& model);
// Makes that directory (not its parents: a checkpoint removed while it was
// written stays removed) and returns its path; PERMISSION_DENIED naming it.
absl::StatusOr<std::string> MakeModelCheckpointDirectory(const std::string& dir, const std::string& model);
// The file rank `rank` of a gang of `world` writes the optimizer states it
// holds to, in a model's directory.
std::string OptimizerStatePath(const std::string& model_dir, int rank, int world);
// Every rank's optimizer file in a model's directory, of the one gang that
// wrote them, whatever its size. DATA_LOSS naming the directory when a
// shard is missing or shards of two gang sizes sit together (each would
// give some tensors' states, silently mixed).
absl::StatusOr<std::vector<std::string>> OptimizerStateFiles(const std::string& model_dir);

// What each rank writes into a checkpoint being committed, given its
// directory.
struct CheckpointWriters {
  // The optimizer states this rank holds (every rank: a share each).
  std::function<absl::Status(const std::string& dir)> optimizer_states;
  // The trained weights, the same on every rank (rank 0 only).
  std::function<absl::Status(const std::string& dir)> weights;
};

// One gang's checkpoints of a run. Every rank of the gang holds one and
// makes the same calls, which meet in the gang's collectives. Not
// thread-safe; `gang` must outlive it.
class RunCheckpoints {
 public:
  RunCheckpoints(std::string dir, policies::ProcessGroup& gang) : dir_(std::move(dir)), gang_(gang) {}

  // Before the gang's first commit: rank 0 removes what earlier runs left
  // half-written (never this gang's own), then the ranks agree on the mark
  // that names this gang's unfinished checkpoints.
  absl::Status Start();

  // Writes the checkpoint after `iteration` iterations with `state` and
  // returns its directory, once rank 0 has made it the newest complete one
  // (the driver records it when rank 0 has replied). Errors are this rank's
  // own or a collective's; rank 0 removes what a failed or interrupted
  // commit wrote.
  absl::StatusOr<std::string> Commit(int64_t iteration, const CheckpointState& state, const CheckpointWriters& writers);

 private:
  const std::string dir_;
  policies::ProcessGroup& gang_;
  std::string unfinished_mark_;  // ".tmp-" and what rank 0 drew at Start
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_RUN_CHECKPOINT_H_
