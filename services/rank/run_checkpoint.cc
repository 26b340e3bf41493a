#include "services/rank/run_checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/interrupt.h"
#include "base/log.h"
#include "base/status_macros.h"

// On-disk layout of a run's checkpoint.dir:
//
//   iter-<N>/                  the checkpoint after N iterations (N printed
//                              %06d); complete once it holds state.json
//     state.json               what resume reads back (checkpoint_state.h):
//                              the iteration, how many lines of the run's
//                              metrics file it follows, the run's id, the
//                              gang size, the driver's saved scalars
//     <model>/                 one per trained model: actor, critic, reward
//       (weights)              PlacedModel::Save's files, in HF layout
//       optimizer.safetensors  the optimizer states, written by a gang of one
//       optimizer-rank<R>-of-<W>.safetensors
//                              rank R's share of them, in a gang of W ranks
//   iter-<N>.tmp-<G>/          a checkpoint gang G (8 hex digits its rank 0
//                              drew) is writing; no other gang writes into it
//   iter-<N>.tmp/              the same, from before gangs marked theirs
//
// Anything else in the directory is not ours and is left alone.
//
// Commit (RunCheckpoints::Commit), the same calls on every rank:
//   1. rank 0 makes iter-<N>.tmp-<G>; barrier;
//   2. every rank writes its optimizer shards; barrier;
//   3. rank 0 writes the weights (after the last barrier: a slow disk must
//      not outlast the other ranks' collective timeout), then state.json
//      (atomically), renames the directory to iter-<N> (the commit) and
//      syncs checkpoint.dir.
// A commit that fails or is interrupted removes its own iter-<N>.tmp-<G>;
// whatever a crash leaves is removed by the next gang's rank 0 as it starts
// (RunCheckpoints::Start). A rank 0 whose gang was given up publishes
// nothing: it checks the interrupt its Unload set before state.json.
//
// Resume (LatestCheckpoint) takes the newest iter-<N> that holds state.json;
// the metrics file is cut back to the lines state.json counts (MetricsLog).

namespace strata::services {
namespace {

constexpr char kCheckpointPrefix[] = "iter-";
constexpr size_t kCheckpointPrefixLength = sizeof(kCheckpointPrefix) - 1;
// Ends an unfinished checkpoint's name: ".tmp-G" since gangs mark theirs,
// ".tmp" before.
constexpr char kUnfinishedMark[] = ".tmp-";
constexpr char kUnfinishedMarkBeforeGangs[] = ".tmp";
constexpr char kStateFile[] = "state.json";
constexpr char kSoloOptimizerFile[] = "optimizer.safetensors";

std::string CheckpointName(int64_t iteration) { return absl::StrFormat("%s%06d", kCheckpointPrefix, iteration); }

// A gang's ranks each write the optimizer states they hold; a single rank
// writes them all under the plain name.
std::string OptimizerStateFile(int rank, int world) {
  return world == 1 ? kSoloOptimizerFile : absl::StrCat("optimizer-rank", rank, "-of-", world, ".safetensors");
}

bool IsCheckpointName(const std::string& name) { return name.rfind(kCheckpointPrefix, 0) == 0; }

// Removes what runs that stopped mid-checkpoint left (a crash, a kill -9,
// an interrupted commit): never a checkpoint anyone resumes, and as big as
// a whole one. A writer still at work on one (a gang given up, not yet
// stopped) cannot publish it afterwards: its directory is gone and is not
// made again (MakeModelCheckpointDirectory). What cannot be removed is
// left, with a warning: it does not stop a run. Returns how many were
// removed.
int RemoveUnfinishedCheckpoints(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator entries(dir, ec);
  if (ec) return 0;  // no checkpoint.dir yet; one that cannot be listed fails in LatestCheckpoint
  int removed = 0;
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (!IsCheckpointName(name) || name.find(kUnfinishedMarkBeforeGangs) == std::string::npos) continue;
    if (RemoveTree(entry.path().string())) {
      ++removed;
    } else {
      STRATA_LOG(Warning) << "checkpoint.dir: cannot remove " << entry.path().string() << ", left half-written";
    }
  }
  return removed;
}

// A name for this gang's unfinished checkpoints, from rank 0 to all.
absl::StatusOr<std::string> AgreeOnGangMark(policies::ProcessGroup& gang) {
  at::Tensor mark = at::zeros({1}, at::kLong);
  if (gang.rank() == 0) mark.fill_(static_cast<int64_t>(std::random_device{}() & 0x7fffffff));
  std::vector<at::Tensor> tensors = {mark};
  STRATA_RETURN_IF_ERROR(gang.Broadcast(tensors, 0));
  return absl::StrFormat("%s%08x", kUnfinishedMark, tensors[0].item<int64_t>());
}

}  // namespace

absl::StatusOr<std::pair<std::string, int64_t>> LatestCheckpoint(const std::string& dir) {
  std::pair<std::string, int64_t> best{"", -1};
  std::error_code ec;
  const bool is_directory = std::filesystem::is_directory(dir, ec);
  // Not there yet is a fresh run; there but unreadable (EACCES, a stale
  // mount) must not pass for one.
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return ErrnoToStatus(ec.value(), absl::StrCat("checkpoint.dir ", dir));
  }
  if (!is_directory) return best;
  std::filesystem::directory_iterator entries(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("checkpoint.dir ", dir, ": list"));
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (!IsCheckpointName(name) || name.find('.') != std::string::npos) continue;
    // state.json is written last: without it the checkpoint is incomplete.
    if (!IsRegularFile(JoinPath(entry.path().string(), kStateFile))) continue;
    const int64_t it = std::atoll(name.c_str() + kCheckpointPrefixLength);
    if (it > best.second) best = {entry.path().string(), it};
  }
  return best;
}

absl::Status RemoveCheckpoints(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator entries(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("checkpoint.dir ", dir, ": list"));
  for (const auto& entry : entries) {
    if (!IsCheckpointName(entry.path().filename().string())) continue;
    if (!RemoveTree(entry.path().string())) {
      return absl::InternalError(absl::StrCat("checkpoint.dir: cannot remove ", entry.path().string()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointState> ReadCheckpointState(const std::string& dir, int64_t iteration) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(JoinPath(dir, kStateFile)));
  return ParseCheckpointState(text, dir, iteration);
}

std::string ModelCheckpointDirectory(const std::string& dir, const std::string& model) { return JoinPath(dir, model); }

absl::StatusOr<std::string> MakeModelCheckpointDirectory(const std::string& dir, const std::string& model) {
  const std::string sub = ModelCheckpointDirectory(dir, model);
  std::error_code ec;
  // Not create_directories: a checkpoint directory a later run removed
  // (RemoveUnfinishedCheckpoints) must stay gone, not come back in part.
  std::filesystem::create_directory(sub, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("checkpoint: cannot create ", sub, ": ", ec.message()));
  return sub;
}

std::string OptimizerStatePath(const std::string& model_dir, int rank, int world) {
  return JoinPath(model_dir, OptimizerStateFile(rank, world));
}

absl::StatusOr<std::vector<std::string>> OptimizerStateFiles(const std::string& model_dir) {
  std::map<int, std::set<int>> ranks_by_world;  // world size -> ranks present
  std::error_code ec;
  std::filesystem::directory_iterator entries(model_dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat(model_dir, ": list optimizer states"));
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    int rank = 0, world = 0;
    if (name == kSoloOptimizerFile) {
      world = 1;
    } else if (std::sscanf(name.c_str(), "optimizer-rank%d-of-%d.safetensors", &rank, &world) != 2 ||
               name != OptimizerStateFile(rank, world)) {
      continue;
    }
    ranks_by_world[world].insert(rank);
  }
  if (ranks_by_world.empty()) return absl::DataLossError(absl::StrCat(model_dir, ": no optimizer state"));
  if (ranks_by_world.size() > 1) {
    std::vector<int> sizes;
    for (const auto& [world, ranks] : ranks_by_world) sizes.push_back(world);
    return absl::DataLossError(absl::StrCat(model_dir, ": optimizer states of gangs of ", absl::StrJoin(sizes, " and "),
                                            " ranks together; a checkpoint holds one gang's"));
  }
  const auto& [world, ranks] = *ranks_by_world.begin();
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    const std::string path = OptimizerStatePath(model_dir, r, world);
    if (!ranks.contains(r)) return absl::DataLossError(absl::StrCat(path, " is missing (rank ", r, " of ", world, ")"));
    out.push_back(path);
  }
  return out;
}

absl::Status RunCheckpoints::Start() {
  if (gang_.rank() == 0) {
    // Before this gang's first commit, so never one of its own.
    if (const int removed = RemoveUnfinishedCheckpoints(dir_); removed > 0) {
      STRATA_LOG(Info) << "checkpoint.dir " << dir_ << ": removed " << removed
                       << " checkpoint(s) an earlier run left half-written";
    }
  }
  STRATA_ASSIGN_OR_RETURN(unfinished_mark_, AgreeOnGangMark(gang_));
  return absl::OkStatus();
}

absl::StatusOr<std::string> RunCheckpoints::Commit(int64_t iteration, const CheckpointState& state,
                                                   const CheckpointWriters& writers) {
  const std::string final_dir = JoinPath(dir_, CheckpointName(iteration));
  const std::string tmp_dir = final_dir + unfinished_mark_;
  // A commit that fails (a rank lost, a full disk, an interrupt) leaves no
  // half-written copy of the model behind. The name is this gang's own, so
  // this removes nothing another gang writes.
  bool committed = false;
  absl::Cleanup remove_unfinished = [&] {
    if (gang_.rank() == 0 && !committed) RemoveTree(tmp_dir);
  };
  std::error_code ec;
  if (gang_.rank() == 0) {
    // No earlier copy to clear: the name is this gang's, and a failed
    // commit of it removed its own.
    std::filesystem::create_directories(tmp_dir, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat("checkpoint.dir: cannot create ", tmp_dir));
  }
  STRATA_RETURN_IF_ERROR(gang_.Barrier());
  absl::Status written = writers.optimizer_states(tmp_dir);
  // Every rank's part is on disk (or this rank failed: its own error wins).
  STRATA_RETURN_IF_ERROR(written);
  STRATA_RETURN_IF_ERROR(gang_.Barrier());
  if (gang_.rank() == 0) {
    STRATA_RETURN_IF_ERROR(writers.weights(tmp_dir));
    // A rank 0 whose gang was given up (stopped, then resumed) must not
    // publish: its Unload has set the interrupt by now, and a new gang may
    // be writing this same checkpoint.
    written = CheckInterrupt("checkpoint commit");
    if (written.ok()) {
      written = WriteFileAtomically(JoinPath(tmp_dir, kStateFile),
                                    SerializeCheckpointState(state, iteration, gang_.world_size()));
    }
    if (written.ok()) {
      RemoveTree(final_dir);
      std::filesystem::rename(tmp_dir, final_dir, ec);
      if (ec) written = absl::InternalError(absl::StrCat("checkpoint: rename ", tmp_dir, ": ", ec.message()));
      committed = !ec;
      // The rename is the commit: on disk before the driver records it.
      if (written.ok()) written = SyncDirectory(dir_);
    }
  }
  STRATA_RETURN_IF_ERROR(written);
  return final_dir;
}

}  // namespace strata::services
