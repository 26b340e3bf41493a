// A job's gang inside this process: N ranks, each with its own models (a
// LocalWorkerGroup) and JobRank, on their own threads, meeting through a
// Gloo process group over loopback. `strata train` runs a gang of one
// (no c10d at all, unless parallel.backend names one) or, with --workers N,
// of N; tests compare the two.
#ifndef STRATA_SERVICES_RANK_LOCAL_GANG_H_
#define STRATA_SERVICES_RANK_LOCAL_GANG_H_

#include <chrono>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/dist/process_group.h"
#include "policies/job/job_spec.h"
#include "services/driver/job_runner.h"
#include "services/rank/job_rank.h"
#include "services/rank/local_worker_group.h"

namespace strata::services {

// How a job's ranks talk, from parallel.backend and memory.device: "auto"
// is NCCL on a GPU when the build has it, Gloo otherwise; a named backend
// also builds a group for a gang of one (to run its path on one GPU).
struct GangBackend {
  policies::Backend backend = policies::Backend::kGloo;
  int device_index = 0;  // the GPU NCCL runs on
  bool group_of_one = false;
};
absl::StatusOr<GangBackend> ChooseGangBackend(const policies::JobSpec& spec);

class LocalGang final : public Gang {
 public:
  // Loads `ranks` copies of the job's models and data. UNIMPLEMENTED for
  // more than one rank in a build without Gloo.
  static absl::StatusOr<std::unique_ptr<LocalGang>> Create(const policies::JobSpec& spec, int ranks,
                                                           const JobRankOptions& options,
                                                           std::chrono::milliseconds timeout = std::chrono::seconds(60),
                                                           const RewardAccess& access = {});
  ~LocalGang() override;

  absl::StatusOr<PhaseReply> Run(const PhaseRequest& request) override;

  int size() const { return static_cast<int>(ranks_.size()); }

 private:
  struct Rank {
    std::unique_ptr<policies::ProcessGroup> group;
    std::unique_ptr<LocalWorkerGroup> models;
    std::unique_ptr<JobRank> job;
  };
  LocalGang() = default;
  std::vector<Rank> ranks_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_LOCAL_GANG_H_
