// What must hold after a soak, however its faults fell. Each check takes
// what it inspects as arguments (files, the job list, Redis's keys), so a
// test can plant a fault and see the check catch it.
#ifndef STRATA_TESTS_SOAK_INVARIANTS_H_
#define STRATA_TESTS_SOAK_INVARIANTS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace strata::soak {

struct Violation {
  std::string invariant;  // e.g. "lost job", "duplicated iteration"
  std::string detail;     // which job, file or key, and what was seen
};

// A job as the harness saw it at the end.
struct JobOutcome {
  std::string id;
  std::string state;  // SUCCEEDED, FAILED, CANCELLED, or QUEUED/RUNNING
  std::string error_message;
  std::string output_dir;
  std::string continues;  // the ended job this one continues, "" for none
  std::string continued_by;
  int64_t iteration = 0;     // completed, as the coordinator reports
  int64_t iterations = 0;    // planned
  bool progressing = false;  // not ended, but its iteration moved lately
};

bool IsTerminal(const std::string& state);

// Every job the coordinator acknowledged is still known to it (`listed`:
// what ListJobs/GetJob return by id) and has ended, or is still progressing.
std::vector<Violation> CheckNoJobLostOrStuck(const std::vector<std::string>& acknowledged,
                                             const std::map<std::string, JobOutcome>& listed);

// A metrics file holds each iteration at most once, in order, from 0 with
// no gap; a SUCCEEDED job's holds exactly its planned iterations. A job
// continued by another shares its file: only the last of the chain is
// checked for the count (`complete_iterations` < 0 skips the count).
std::vector<Violation> CheckMetricsOnce(const std::string& path, int64_t complete_iterations);

// Compares a job's metrics with those of the same spec run without faults,
// wall clock and memory aside, within the tolerances of a float sum taken
// in another order (tests/e2e/run_metrics.h). `sequences` and `ppo_epochs`
// count a clip fraction's tokens.
std::vector<Violation> CheckSameMetrics(const std::string& reference_path, const std::string& path,
                                        const std::string& job_id, int sequences, int ppo_epochs);

// A FAILED job says why, in words: a message, not a bare code.
std::vector<Violation> CheckFailedSaysWhy(const JobOutcome& job);

// Each committed checkpoint of a job (checkpoint_dir/iter-N) was written
// by the job or a job it continues (`run_ids`), follows exactly N metrics
// lines, and no unfinished one (iter-N.tmp...) is left once no job runs.
std::vector<Violation> CheckCheckpoints(const std::string& checkpoint_dir, const std::set<std::string>& run_ids);

// Once every job ended, a worker's NVMe directory holds nothing of any job
// (`ignored`: names the harness itself put there).
std::vector<Violation> CheckNvmeDirectoryEmpty(const std::string& dir, const std::set<std::string>& ignored);

// Every key under `prefix` belongs to a job the coordinator lists, or is
// one of the store's own (the job index, its state sets, workers); each
// job sits in exactly the state set of its state. `state_members`: the
// members of each jobs:state:<STATE> set; `request_targets`: the job ids
// request:<id> keys point at.
std::vector<Violation> CheckRedisKeys(const std::string& prefix, const std::vector<std::string>& keys,
                                      const std::map<std::string, JobOutcome>& jobs,
                                      const std::map<std::string, std::vector<std::string>>& state_members,
                                      const std::vector<std::string>& request_targets);

// No process whose command line names the soak's directory is running but
// the stack's own (`live`).
std::vector<Violation> CheckNoStrayProcesses(const std::string& marker, const std::vector<int>& live);

}  // namespace strata::soak

#endif  // STRATA_TESTS_SOAK_INVARIANTS_H_
