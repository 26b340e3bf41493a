// The Prometheus metrics of one strata process (a coordinator or a worker)
// and the HTTP endpoint that serves them (`--metrics-listen`), through
// prometheus-cpp. Names follow Prometheus conventions: the strata_ prefix,
// base units (seconds, bytes) and _total on counters; labels take a handful
// of values each (phase, tier, state, RPC method and code), never job ids.
// Every metric is listed with its meaning in docs/OPERATIONS.md.
#ifndef STRATA_SERVICES_TELEMETRY_SERVICE_METRICS_H_
#define STRATA_SERVICES_TELEMETRY_SERVICE_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace strata::services {

// This process's resident memory now and at its peak (VmRSS, VmHWM), as the
// kernel counts it: what the OOM killer sees, mapped files and libtorch's
// own buffers included. {0, 0} where /proc is not readable.
std::pair<int64_t, int64_t> ProcessResidentBytes();

class ServiceMetrics {
 public:
  // The process's metrics. Recording works whether or not Serve was called.
  static ServiceMetrics& Global();

  // Serves GET /metrics on HOST:PORT (port 0 picks a free one). Once per
  // process; INVALID_ARGUMENT for a malformed address, UNAVAILABLE when the
  // port cannot be bound.
  absl::Status Serve(const std::string& listen);
  // The bound port, 0 before Serve.
  int port() const;

  // A timed phase of a job (rollout, score, update, train, evaluate) ended:
  // strata_phase_seconds{phase}. A rollout also sets the decoding rate.
  void ObservePhase(const std::string& phase, double seconds, int64_t generated_tokens);
  // The driver finished an iteration of an `algorithm` job (coordinator).
  void CountIteration(const std::string& algorithm, double seconds);
  // A job waited this long between submission and its first start.
  void ObserveQueueWait(double seconds);
  // A served RPC ended (method "Service/Method", code "OK", "UNAVAILABLE", ...).
  void ObserveRpc(const std::string& method, const std::string& code, double seconds);
  // A Redis command failed (connection lost, error reply, timeout).
  void CountRedisError();
  // Bytes a tier holds now and the peak of the last phase.
  void SetMemory(const std::string& tier, int64_t in_use_bytes, int64_t phase_peak_bytes);

  // Figures read from elsewhere at each scrape, e.g. jobs by state from
  // Redis: {label value -> count}. An empty map (source failed) exports nothing.
  using CountSource = std::function<std::map<std::string, int64_t>()>;
  void SetJobStateSource(CountSource source);     // strata_jobs{state}
  void SetWorkerStateSource(CountSource source);  // strata_workers{state}

  ServiceMetrics(const ServiceMetrics&) = delete;
  ServiceMetrics& operator=(const ServiceMetrics&) = delete;

  class Impl;

 private:
  ServiceMetrics();
  ~ServiceMetrics();
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_TELEMETRY_SERVICE_METRICS_H_
