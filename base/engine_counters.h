// Process-wide counters of the work the engine has done since the process
// started, for the metrics endpoint (services/telemetry reads them at each
// scrape). Relaxed atomics: they are figures, not synchronisation, and
// incrementing one costs a few nanoseconds on paths that move megabytes.
#ifndef STRATA_BASE_ENGINE_COUNTERS_H_
#define STRATA_BASE_ENGINE_COUNTERS_H_

#include <atomic>
#include <cstdint>

namespace strata {

struct EngineCounters {
  std::atomic<int64_t> nvme_read_bytes{0};  // by the NVMe tier's I/O engines
  std::atomic<int64_t> nvme_written_bytes{0};
  std::atomic<int64_t> adam_parameters{0};   // parameter updates by CPU Adam
  std::atomic<int64_t> generated_tokens{0};  // tokens decoded by generation

  static void Add(std::atomic<int64_t>& counter, int64_t n) { counter.fetch_add(n, std::memory_order_relaxed); }
  static int64_t Read(const std::atomic<int64_t>& counter) { return counter.load(std::memory_order_relaxed); }
};

EngineCounters& GlobalEngineCounters();

}  // namespace strata

#endif  // STRATA_BASE_ENGINE_COUNTERS_H_
