#include "services/rank/local_gang.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata::services {

absl::StatusOr<GangBackend> ChooseGangBackend(const policies::JobSpec& spec) {
  const int device = spec.memory.device_index;
  GangBackend chosen;
  chosen.device_index = device < 0 ? 0 : device;
  const std::string& named = spec.parallel.backend;
  if (named == "nccl" ||
      (named == "auto" && device >= 0 && policies::ProcessGroup::Available(policies::Backend::kNccl))) {
    chosen.backend = policies::Backend::kNccl;
  }
  chosen.group_of_one = named != "auto";
  if (chosen.group_of_one && !policies::ProcessGroup::Available(chosen.backend)) {
    return absl::UnimplementedError(
        absl::StrCat("parallel.backend: ", named, ": this build has no ", policies::BackendName(chosen.backend)));
  }
  return chosen;
}

absl::StatusOr<std::unique_ptr<LocalGang>> LocalGang::Create(const policies::JobSpec& spec, int ranks,
                                                             const JobRankOptions& options,
                                                             std::chrono::milliseconds timeout,
                                                             const RewardAccess& access) {
  if (ranks < 1) return absl::InvalidArgumentError(absl::StrCat("workers must be >= 1, got ", ranks));
  STRATA_ASSIGN_OR_RETURN(const GangBackend backend, ChooseGangBackend(spec));
  policies::ProcessGroup::InProcessOptions in_process;
  in_process.backend = backend.backend;
  in_process.device_index = backend.device_index;
  in_process.group_of_one = backend.group_of_one;
  in_process.timeout = timeout;
  STRATA_ASSIGN_OR_RETURN(auto groups, policies::ProcessGroup::CreateInProcess(ranks, in_process));
  std::unique_ptr<LocalGang> gang(new LocalGang());
  for (int r = 0; r < ranks; ++r) {
    Rank rank;
    rank.group = std::move(groups[static_cast<size_t>(r)]);
    STRATA_ASSIGN_OR_RETURN(rank.models, LocalWorkerGroup::Create(spec, rank.group.get(), access));
    STRATA_ASSIGN_OR_RETURN(rank.job,
                            JobRank::Create(spec, *rank.models, rank.models->tokenizer(), *rank.group, options));
    gang->ranks_.push_back(std::move(rank));
  }
  return gang;
}

LocalGang::~LocalGang() {
  // Jobs before the models they use, models before their group.
  for (Rank& r : ranks_) r.job.reset();
  for (Rank& r : ranks_) r.models.reset();
}

absl::StatusOr<PhaseReply> LocalGang::Run(const PhaseRequest& request) {
  auto run_rank = [&](Rank& rank) -> absl::StatusOr<PhaseReply> {
    try {
      return rank.job->Run(request);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(request.phase, ": ", e.what()));
    }
  };
  if (ranks_.size() == 1) {
    STRATA_ASSIGN_OR_RETURN(auto reply, run_rank(ranks_[0]));
    return MergeReplies({reply});
  }
  std::vector<absl::StatusOr<PhaseReply>> replies(ranks_.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    threads.emplace_back([&, r] { replies[r] = run_rank(ranks_[r]); });
  }
  for (auto& t : threads) t.join();
  std::vector<absl::Status> statuses;
  std::vector<PhaseReply> ok;
  for (auto& reply : replies) {
    statuses.push_back(reply.status());
    if (reply.ok()) ok.push_back(*reply);
  }
  STRATA_RETURN_IF_ERROR(FirstCause(statuses, /*ranks_share_a_process=*/true));
  return MergeReplies(ok);
}

}  // namespace strata::services
