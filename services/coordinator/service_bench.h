// `strata bench service`: N concurrent clients against a running coordinator
// for a bounded time. Each submits one job, then lists jobs and reads its
// job in a loop while a second stream watches its events. Latencies per call
// are reported as percentiles next to the peer: the same reads made straight
// against the job store's Redis (what the coordinator adds on top of it).
#ifndef STRATA_SERVICES_COORDINATOR_SERVICE_BENCH_H_
#define STRATA_SERVICES_COORDINATOR_SERVICE_BENCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::services {

struct ServiceBenchRequest {
  std::string addr = "127.0.0.1:50051";
  std::string token;      // bearer token
  std::string redis;      // redis://HOST:PORT of the same stack (the peer); "" skips it
  std::string spec_yaml;  // the job each client submits
  int clients = 50;
  double seconds = 10;
  bool json = false;
};

struct LatencySummary {
  int64_t calls = 0;
  int64_t errors = 0;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0;
};

struct ServiceLoadResult {
  std::map<std::string, LatencySummary> calls;  // "submit", "list", "get", "watch_events", "store_get"
  std::vector<std::string> error_samples;       // first few error messages
  int64_t total_errors = 0;
};

absl::StatusOr<ServiceLoadResult> RunServiceLoad(const ServiceBenchRequest& request);
absl::StatusOr<std::string> RunServiceBench(const ServiceBenchRequest& request);

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_SERVICE_BENCH_H_
