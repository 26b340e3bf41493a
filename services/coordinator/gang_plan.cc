#include "services/coordinator/gang_plan.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::services {

GangPlan PlanGangs(const std::vector<QueuedGangJob>& jobs, const std::vector<SchedulableWorker>& workers) {
  GangPlan plan;
  std::set<std::string> taken;                         // given to a job earlier in this pass
  std::map<std::string, const QueuedGangJob*> holder;  // held worker -> the job holding it
  const int64_t registered = static_cast<int64_t>(workers.size());
  for (const QueuedGangJob& job : jobs) {
    GangDecision& decision = plan.decisions.emplace_back();
    decision.job_id = job.id;
    if (!job.waits_for.empty()) {
      decision.waiting = absl::StrCat("waiting: job ", job.waits_for,
                                      ", which this job continues, is still stopping on its workers");
      continue;
    }
    if (registered < job.workers) {
      // Submit checked a gang's count; workers that left since (or none yet,
      // for a job of one) leave the job waiting, and it holds nothing: more
      // may never register.
      decision.waiting = absl::StrCat("waiting: the job needs ", job.workers, job.workers == 1 ? " worker" : " workers",
                                      " (spec key 'parallel.workers'); ", registered, registered == 1 ? " is" : " are",
                                      " registered");
      continue;
    }
    int64_t able = 0;  // registered workers that run what it needs
    for (const SchedulableWorker& worker : workers) able += worker.Runs(job.needs) ? 1 : 0;
    if (able < job.workers) {
      // Like too few registered workers: it holds nothing.
      decision.waiting = absl::StrCat("waiting: the job needs ", job.workers, job.workers == 1 ? " worker" : " workers",
                                      " that run ", absl::StrJoin(job.needs, " and "), "; ", able, " of the ",
                                      registered, " registered ", able == 1 ? "does" : "do");
      continue;
    }
    std::vector<std::string> gang;
    int64_t answering = 0;      // busy or free
    int64_t free_but_held = 0;  // free, held for an older job
    const QueuedGangJob* behind = nullptr;
    for (const SchedulableWorker& worker : workers) {
      if (worker.state == WorkerState::kKeptOut || !worker.Runs(job.needs)) continue;
      ++answering;
      if (worker.state == WorkerState::kBusy || taken.count(worker.id)) continue;
      if (auto h = holder.find(worker.id); h != holder.end()) {
        ++free_but_held;
        if (behind == nullptr) behind = h->second;
        continue;
      }
      if (static_cast<int64_t>(gang.size()) < job.workers) gang.push_back(worker.id);
    }
    if (!job.backing_off && static_cast<int64_t>(gang.size()) == job.workers) {
      taken.insert(gang.begin(), gang.end());
      decision.gang = std::move(gang);
      continue;
    }
    if (job.workers > 1 && answering >= job.workers) {
      for (const std::string& id : gang) {
        holder[id] = &job;
        plan.held.insert(id);
      }
    }
    // Told only when held workers are what keeps the job waiting.
    if (!job.backing_off && behind != nullptr && static_cast<int64_t>(gang.size()) + free_but_held >= job.workers) {
      decision.waiting = absl::StrCat("waiting: queued behind ",
                                      behind->tenant == job.tenant ? "job " + behind->id : std::string("a job"),
                                      ", which is older and needs ", behind->workers,
                                      " workers; the free ones are held for it");
    }
  }
  return plan;
}

}  // namespace strata::services
