// The phase protocol between a job's driver (services/driver: the
// coordinator, or `strata train`) and its ranks (services/rank): what a
// phase call carries, the phases by name, and how the ranks' replies merge
// into the gang's. Torch-free: both planes use it.
#ifndef STRATA_SERVICES_PHASE_PHASE_H_
#define STRATA_SERVICES_PHASE_PHASE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/job/metrics.h"

namespace strata::services {

// The phases, in the order a run uses them:
//   find_checkpoint  the newest complete checkpoint this run may continue:
//                    reply text = its directory ("" for none), metrics
//                    "iteration", "metrics_lines" and "state/<key>" (the
//                    driver's scalars). `text` names a checkpoint the job
//                    store knows to be this run's (written before checkpoints
//                    recorded their run); FAILED_PRECONDITION for another
//                    run's checkpoints.
//   start            loads checkpoint `text` ("" starts afresh); rank 0 keeps
//                    the first params["metrics_lines"] lines of the metrics
//                    file.
//   rollout, score, update   one RL iteration (score takes params such as
//                    "kl_coef"); train: one SFT or reward-model step.
//   evaluate         eval/* metrics of the whole eval set as mean shares
//                    (below; none configured: no metrics).
//   commit           rank 0 appends `text` (the iteration's metrics line) to
//                    the metrics file; with params["checkpoint"] = 1 every
//                    rank writes its optimizer states into checkpoint
//                    iter-<iteration+1>, then rank 0 the weights and the
//                    state; the reply's text names it, complete once rank 0
//                    has replied. params["state/<key>"] are recorded in it.
//   finish           rank 0 writes the trained model to output.dir.
// Writes that one rank makes alone come after the phase's last collective,
// so that no rank waits in one (bounded by the collective timeout) while
// another writes more than it: commit and finish end with rank 0's writes.
// Replies carry time/<phase>_s and memory/<tier>_peak_bytes of the phase
// as this rank saw it; every other metric is the gang's.

// The phase names (PhaseRequest::phase), as above.
namespace phases {
inline constexpr char kFindCheckpoint[] = "find_checkpoint";
inline constexpr char kStart[] = "start";
inline constexpr char kRollout[] = "rollout";
inline constexpr char kScore[] = "score";
inline constexpr char kUpdate[] = "update";
inline constexpr char kTrain[] = "train";
inline constexpr char kEvaluate[] = "evaluate";
inline constexpr char kCommit[] = "commit";
inline constexpr char kFinish[] = "finish";
}  // namespace phases

// Whether every rank of the gang ends `phase` in a collective, so that the
// ranks end it within the collective timeout of each other. Rollout,
// find_checkpoint, evaluate, commit and finish do not: a driver must not
// take a rank that is still busy there for a hung one.
bool PhaseEndsInCollective(const std::string& phase);

// A gang mean that the driver takes, not a collective: a phase that ends in
// none (evaluate) reports each rank's sum and count as "mean_sum/<key>" and
// "mean_count/<key>", and MergeReplies writes <key> = the ranks' sums over
// their counts. The ranks need not meet for it, so a rank that generates
// longer responses does not hold the others in a collective (bounded by its
// timeout) meanwhile.
void AddMeanShare(const std::string& key, double sum, double count, policies::Metrics& out);
std::string MeanCountKey(const std::string& key);
bool IsMeanShare(const std::string& metric);
// The mean whose sum share `metric` is; "" for none.
std::string MeanOfSumShare(const std::string& metric);

struct PhaseRequest {
  std::string phase;
  int64_t iteration = 0;
  policies::Metrics params;
  std::string text;
};

struct PhaseReply {
  policies::Metrics metrics;
  std::string text;
};

// True for time/*, memory/* and nvme/* (traffic) metrics: each rank's own
// figures, not the gang's (the others are global, the same on every rank).
bool IsRankMeasurement(const std::string& metric);

// Rank 0's reply, with each time/* and memory/* figure the largest any rank
// reported, and each mean whose shares the ranks reported (AddMeanShare)
// taken over all of them. INTERNAL for no replies, and naming the rank for a
// share missing from its reply or a count that is negative.
absl::StatusOr<PhaseReply> MergeReplies(const std::vector<PhaseReply>& replies);

}  // namespace strata::services

#endif  // STRATA_SERVICES_PHASE_PHASE_H_
