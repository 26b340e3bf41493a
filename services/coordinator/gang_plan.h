// One scheduling pass, decided without I/O: which queued jobs start on
// which free workers, and what the others are told while they wait. The
// coordinator gathers the state under its lock, plans, marks the chosen
// workers busy, and claims the jobs in Redis afterwards.
//
// The policy: oldest job first. A job starts when enough free workers that
// run what it needs (its c10d backend, a GPU) are left for it; workers that
// do not are never offered it. A gang job (two workers or more) that cannot start yet, for
// lack of free workers or while it waits out its backoff after a lost
// gang, holds the free workers it would take: younger jobs of fewer
// workers would otherwise take each worker as it frees, and the gang job
// could wait for ever. It holds only while enough workers answer (busy or
// free) to form its gang; workers kept out after they stopped answering
// may never come back, and a job waiting for them holds nothing.
#ifndef STRATA_SERVICES_COORDINATOR_GANG_PLAN_H_
#define STRATA_SERVICES_COORDINATOR_GANG_PLAN_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace strata::services {

struct QueuedGangJob {
  std::string id;
  std::string tenant;        // a waiting job is told another tenant's job id never
  int64_t workers = 1;       // parallel.workers
  bool backing_off = false;  // requeued after a lost gang, its backoff not yet over
  // The ended job this one continues, while that job's run still stops on
  // its workers (it may still write its checkpoint.dir): the job waits.
  std::string waits_for;
  // What each worker of its gang must run ("gloo", "nccl", "cuda").
  std::vector<std::string> needs;
};

enum class WorkerState {
  kFree,
  kBusy,     // in a gang of this coordinator
  kKeptOut,  // stopped answering; out of gangs until its backoff ends
};

struct SchedulableWorker {
  std::string id;
  WorkerState state = WorkerState::kFree;
  // What it said it runs; nullopt when it said nothing (any job's).
  std::optional<std::set<std::string>> runs = std::nullopt;

  bool Runs(const std::vector<std::string>& needs) const {
    if (!runs.has_value()) return true;
    for (const std::string& need : needs) {
      if (runs->count(need) == 0) return false;
    }
    return true;
  }
};

struct GangDecision {
  std::string job_id;
  std::vector<std::string> gang;  // the workers in rank order; empty while the job waits
  std::string waiting;            // why it waits, to tell its watchers; "" for no news
};

struct GangPlan {
  std::vector<GangDecision> decisions;  // one per job, in the jobs' order
  std::set<std::string> held;           // free workers held for an older gang job
};

// `jobs` oldest first; `workers` in the order ranks are handed out.
GangPlan PlanGangs(const std::vector<QueuedGangJob>& jobs, const std::vector<SchedulableWorker>& workers);

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_GANG_PLAN_H_
