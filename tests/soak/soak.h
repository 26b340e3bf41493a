// A chaos soak: a stream of real jobs against a local stack (Stack) while
// a nemesis deals faults at random moments, then the invariants
// (invariants.h) over everything that happened.
//
//   soak::SoakOptions options{.dir = "/tmp/soak", .duration = std::chrono::minutes(30), .seed = 7};
//   auto report = soak::RunSoak(options);   // report->violations empty: nothing lost
#ifndef STRATA_TESTS_SOAK_SOAK_H_
#define STRATA_TESTS_SOAK_SOAK_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/soak/invariants.h"

namespace strata::soak {

struct SoakOptions {
  std::string dir;                     // everything the soak writes; must exist
  std::chrono::seconds duration{120};  // of the job stream and the faults
  uint64_t seed = 1;
  int workers = 4;
  int max_jobs_in_flight = 3;
  double mean_seconds_between_faults = 8.0;
  int collective_timeout_ms = 5000;
  // How long the jobs still running when the stream ends may take to end.
  std::chrono::seconds drain_limit{600};
  bool isolate_network = true;
  bool small_disks = true;
  // After the checks, plant the faults the harness must catch (a job's
  // record deleted, a metrics line duplicated, a directory left behind)
  // and check again: report.planted lists what the checks then found.
  bool plant_faults = false;
};

struct FaultFigures {
  int injected = 0;
  int affected_jobs = 0;                 // jobs running where the fault hit
  std::vector<double> recovery_seconds;  // fault to the affected job's next iteration (or its end)
  int unrecovered = 0;                   // affected jobs that never moved again
};

struct ApiFigures {
  int64_t calls = 0;
  int64_t ok = 0;                  // answered (an expected refusal counts: FAILED_PRECONDITION on an ended job)
  int64_t retryable = 0;           // UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, RESOURCE_EXHAUSTED
  int64_t other = 0;               // anything else: each is a violation too
  std::vector<double> latency_ms;  // every call's
};

struct SoakReport {
  uint64_t seed = 0;
  double stream_seconds = 0, drain_seconds = 0, total_seconds = 0;
  int submitted = 0, succeeded = 0, failed = 0, cancelled = 0, continued = 0, compared_with_reference = 0;
  int64_t iterations_completed = 0;
  int restarts = 0, unexpected_exits = 0;
  std::map<std::string, FaultFigures> faults;  // by kind
  ApiFigures api_all, api_during_faults;
  std::vector<std::string> notes;  // faults skipped, failures' reasons
  std::vector<Violation> violations;
  std::vector<Violation> planted;  // with plant_faults
  std::string ToJson() const;
  std::string Summary() const;  // a few lines for people
};

absl::StatusOr<SoakReport> RunSoak(const SoakOptions& options);

}  // namespace strata::soak

#endif  // STRATA_TESTS_SOAK_SOAK_H_
