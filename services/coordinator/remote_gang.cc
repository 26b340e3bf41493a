#include "services/coordinator/remote_gang.h"

#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "services/phase/phase.h"

namespace strata::services {
namespace {

// What the driver reads from each phase's reply.
std::vector<std::string> Required(const std::string& phase) {
  if (phase == phases::kScore) return {"objective/scores", "objective/kl"};
  if (phase == phases::kUpdate) return {"loss/policy_avg"};
  if (phase == phases::kTrain) return {"loss/train_avg"};
  return {};
}

}  // namespace

std::string AddressHost(const std::string& address) {
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

absl::Status CheckPhaseReplies(const PhaseRequest& request, const std::vector<PhaseReply>& replies) {
  if (replies.empty()) return absl::InternalError("no replies");
  for (const std::string& key : Required(request.phase)) {
    for (size_t r = 0; r < replies.size(); ++r) {
      if (!replies[r].metrics.contains(key)) {
        return absl::InternalError(
            absl::StrCat("rank ", r, ": ", request.phase, ": malformed reply: metric ", key, " is missing"));
      }
    }
  }
  if (request.phase == phases::kFindCheckpoint && !replies[0].text.empty()) {
    const auto it = replies[0].metrics.find("iteration");
    if (it == replies[0].metrics.end() || it->second < 0 || it->second != std::floor(it->second)) {
      return absl::InternalError("rank 0: find_checkpoint: malformed reply: no iteration for the checkpoint");
    }
  }
  const PhaseReply& first = replies[0];
  for (size_t r = 1; r < replies.size(); ++r) {
    if (replies[r].text != first.text) {
      return absl::InternalError(absl::StrCat("rank ", r, ": ", request.phase, ": reply '", replies[r].text,
                                              "' differs from rank 0's '", first.text, "'"));
    }
    for (const auto& [key, value] : first.metrics) {
      if (IsRankMeasurement(key) || IsMeanShare(key)) continue;
      const auto it = replies[r].metrics.find(key);
      // The ranks derive global metrics from the same all-reduced sums.
      if (it == replies[r].metrics.end() || std::abs(it->second - value) > 1e-9 * (1 + std::abs(value))) {
        return absl::InternalError(
            absl::StrCat("rank ", r, ": ", request.phase, ": malformed reply: ", key, " = ",
                         it == replies[r].metrics.end() ? std::string("(missing)") : absl::StrCat(it->second),
                         " where rank 0 reports ", value));
      }
    }
  }
  return absl::OkStatus();
}

template <typename T, typename Call>
absl::StatusOr<std::vector<T>> RemoteGang::OnEveryRank(Call call, Ending ending) {
  const size_t n = workers_.size();
  std::vector<absl::StatusOr<T>> results(n, absl::UnknownError("not run"));
  std::vector<bool> ended(n, false);
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  std::vector<std::thread> threads;
  for (size_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<T> result = call(r);
      std::lock_guard<std::mutex> lock(mu);
      results[r] = std::move(result);
      ended[r] = true;
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    // A rank failed in a phase whose ranks do not wait for each other: the
    // others' work there is for nothing, and waiting for it only delays the
    // requeue (their unload interrupts it).
    auto failed_alone = [&] {
      if (ending != Ending::kWithoutCollective) return false;
      for (size_t r = 0; r < n; ++r) {
        if (ended[r] && !results[r].ok()) return true;
      }
      return false;
    };
    cv.wait(lock, [&] { return done > 0; });
    while (done < n) {
      if (cv.wait_for(lock, grace_, [&] { return done == n || failed_alone(); }) && done == n) break;
      // Still busy well after another rank ended the same phase. Where the
      // phase ends in a collective, that rank hangs: its collective would
      // have ended by now. Where it does not, the rank may just have more
      // to do (longer generations, a colder disk): it is given up only
      // once it stops answering, or once another rank failed.
      std::vector<size_t> busy;
      for (size_t r = 0; r < n; ++r) {
        if (!ended[r]) busy.push_back(r);
      }
      const bool failed = failed_alone();
      lock.unlock();
      bool working = ending == Ending::kWithoutCollective && !failed;
      for (size_t r : busy) working = working && workers_[r]->Answers(std::chrono::seconds(1));
      if (!working) {
        if (failed) STRATA_LOG(Info) << "a rank failed; giving up the " << busy.size() << " still working";
        for (auto& worker : workers_) worker->CancelCalls();
        lock.lock();
        break;
      }
      STRATA_LOG(Info) << busy.size() << " rank(s) still working " << grace_.count()
                       << " ms after another ended the phase; they answer, so the gang waits";
      lock.lock();
    }
  }
  for (auto& t : threads) t.join();
  std::vector<absl::Status> statuses;
  std::vector<T> out;
  for (auto& result : results) {
    statuses.push_back(result.status());
    if (result.ok()) out.push_back(std::move(*result));
  }
  STRATA_RETURN_IF_ERROR(FirstCause(statuses));
  return out;
}

absl::StatusOr<std::unique_ptr<RemoteGang>> RemoteGang::Start(std::vector<std::unique_ptr<RemoteRank>> workers,
                                                              const std::string& spec_yaml,
                                                              std::chrono::milliseconds collective_timeout) {
  if (workers.empty()) return absl::InvalidArgumentError("a gang needs at least one worker");
  // A live rank's collective with a failed one ends within the collective
  // timeout; the margin covers the reply's way back.
  std::unique_ptr<RemoteGang> gang(new RemoteGang(std::move(workers), collective_timeout + std::chrono::seconds(5)));
  const int world = static_cast<int>(gang->workers_.size());
  RemoteRank::RendezvousPoint rendezvous;
  if (world > 1) {
    STRATA_ASSIGN_OR_RETURN(rendezvous, gang->workers_[0]->OpenRendezvous(world, collective_timeout));
    rendezvous.host = AddressHost(gang->workers_[0]->options().address);
  }
  // Loading, after the group forms, ends in no collective.
  auto started = gang->OnEveryRank<RemoteRank::Loaded>(
      [&](size_t r) {
        return gang->workers_[r]->StartRank(spec_yaml, static_cast<int>(r), world, rendezvous, collective_timeout);
      },
      Ending::kWithoutCollective);
  if (!started.ok()) {
    gang->Unload(nullptr);
    return started.status();
  }
  return gang;
}

absl::StatusOr<PhaseReply> RemoteGang::Run(const PhaseRequest& request) {
  const Ending ending = PhaseEndsInCollective(request.phase) ? Ending::kInCollective : Ending::kWithoutCollective;
  STRATA_ASSIGN_OR_RETURN(auto replies,
                          OnEveryRank<PhaseReply>([&](size_t r) { return workers_[r]->RunPhase(request); }, ending));
  STRATA_RETURN_IF_ERROR(CheckPhaseReplies(request, replies));
  return MergeReplies(replies);
}

void RemoteGang::Unload(const std::function<void(int)>& unloaded) {
  // At once: a rank still in a collective with a lost one answers only when
  // that collective times out, and the others should not wait behind it.
  std::vector<std::thread> threads;
  for (size_t r = 0; r < workers_.size(); ++r) {
    threads.emplace_back([&, r] {
      if (absl::Status s = workers_[r]->Unload(); !s.ok()) {
        STRATA_LOG(Warning) << "unload on " << workers_[r]->options().address << ": " << s;
      }
      if (unloaded) unloaded(static_cast<int>(r));
    });
  }
  for (auto& t : threads) t.join();
}

namespace {

class RemoteFleet final : public WorkerFleet {
 public:
  explicit RemoteFleet(RemoteFleetOptions options) : options_(std::move(options)) {}

  absl::StatusOr<std::unique_ptr<JobGang>> StartGang(const JobRecord& job,
                                                     const std::vector<WorkerRecord>& workers) override {
    STRATA_ASSIGN_OR_RETURN(auto credentials, MakeChannelCredentials(options_.tls));
    std::vector<std::unique_ptr<RemoteRank>> ranks;
    for (const WorkerRecord& worker : workers) {
      RemoteRankOptions remote;
      remote.address = worker.address;
      remote.token = options_.token;
      remote.job_id = job.id;
      remote.resumable_run_ids = job.resumable_run_ids;
      STRATA_ASSIGN_OR_RETURN(auto rank, RemoteRank::Create(remote, credentials));
      ranks.push_back(std::move(rank));
    }
    STRATA_ASSIGN_OR_RETURN(auto gang, RemoteGang::Start(std::move(ranks), job.spec_yaml, options_.collective_timeout));
    return std::unique_ptr<JobGang>(std::move(gang));
  }

  std::vector<bool> Answering(const std::string& job_id, const std::vector<WorkerRecord>& workers) override {
    // Every worker at once: a live one answers in milliseconds.
    std::vector<char> answers(workers.size(), 0);
    auto credentials = MakeChannelCredentials(options_.tls);
    std::vector<std::thread> probes;
    for (size_t i = 0; i < workers.size() && credentials.ok(); ++i) {
      probes.emplace_back([&, i] {
        RemoteRankOptions remote;
        remote.address = workers[i].address;
        remote.job_id = job_id;
        auto worker = RemoteRank::Create(remote, *credentials);
        answers[i] = worker.ok() && (*worker)->Answers(std::chrono::seconds(1));
      });
    }
    for (auto& t : probes) t.join();
    return std::vector<bool>(answers.begin(), answers.end());
  }

 private:
  const RemoteFleetOptions options_;
};

}  // namespace

std::unique_ptr<WorkerFleet> MakeRemoteFleet(RemoteFleetOptions options) {
  return std::make_unique<RemoteFleet>(std::move(options));
}

}  // namespace strata::services
