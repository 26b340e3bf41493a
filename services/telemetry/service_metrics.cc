#include "services/telemetry/service_metrics.h"

#include <CivetServer.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <exception>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/engine_counters.h"
#include "base/log.h"

namespace strata::services {

int ThreadStackFloorBytes();  // thread_stack_floor.cc

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(const std::string& name, const std::string& help, MetricType type) {
  MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

void AddValue(MetricFamily& family, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (family.type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

// Figures that live elsewhere, read at each scrape: the engine's counters,
// the process's memory, and the coordinator's view of jobs and workers.
class ScrapeTimeFigures final : public prometheus::Collectable {
 public:
  void SetJobStateSource(ServiceMetrics::CountSource source) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_ = std::move(source);
  }
  void SetWorkerStateSource(ServiceMetrics::CountSource source) {
    std::lock_guard<std::mutex> lock(mu_);
    workers_ = std::move(source);
  }

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out;
    const EngineCounters& c = GlobalEngineCounters();
    auto counter = [&](const std::string& name, const std::string& help, const std::atomic<int64_t>& value) {
      out.push_back(Family(name, help, MetricType::Counter));
      AddValue(out.back(), static_cast<double>(EngineCounters::Read(value)));
    };
    counter("strata_nvme_read_bytes_total", "Bytes the NVMe tier read from its slot files.", c.nvme_read_bytes);
    counter("strata_nvme_written_bytes_total", "Bytes the NVMe tier wrote to its slot files.", c.nvme_written_bytes);
    counter("strata_cpu_adam_parameters_total", "Parameter updates made by CPU Adam (rate() = parameters/s).",
            c.adam_parameters);
    counter("strata_generated_tokens_total", "Tokens decoded by generation (rate() = tokens/s).", c.generated_tokens);
    const auto [resident, peak] = ProcessResidentBytes();
    out.push_back(
        Family("strata_process_resident_memory_bytes", "Resident memory of this process.", MetricType::Gauge));
    AddValue(out.back(), static_cast<double>(resident));
    out.push_back(Family("strata_process_resident_memory_peak_bytes",
                         "Peak resident memory of this process since it started (VmHWM).", MetricType::Gauge));
    AddValue(out.back(), static_cast<double>(peak));

    ServiceMetrics::CountSource jobs, workers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs = jobs_;
      workers = workers_;
    }
    auto by_state = [&](const ServiceMetrics::CountSource& source, const std::string& name, const std::string& help) {
      if (!source) return;
      const std::map<std::string, int64_t> counts = source();
      if (counts.empty()) return;
      out.push_back(Family(name, help, MetricType::Gauge));
      for (const auto& [state, n] : counts) AddValue(out.back(), static_cast<double>(n), {{"state", state}});
    };
    by_state(jobs, "strata_jobs", "Jobs in the job store by state.");
    by_state(workers, "strata_workers", "Registered workers by state (idle, busy, backoff, held).");
    return out;
  }

 private:
  mutable std::mutex mu_;
  ServiceMetrics::CountSource jobs_;
  ServiceMetrics::CountSource workers_;
};

const prometheus::Histogram::BucketBoundaries kPhaseBuckets = {0.01, 0.05, 0.1, 0.25, 0.5, 1,   2.5, 5,
                                                               10,   30,   60,  120,  300, 600, 1800};
const prometheus::Histogram::BucketBoundaries kRpcBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                             0.25,   0.5,   1,      2.5,   10,   60,    300};
const prometheus::Histogram::BucketBoundaries kQueueBuckets = {0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400};

}  // namespace

std::pair<int64_t, int64_t> ProcessResidentBytes() {
  int64_t resident = 0, peak = 0;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    fields >> key >> kib;
    if (key == "VmRSS:") resident = kib * 1024;
    if (key == "VmHWM:") peak = kib * 1024;
  }
  return {resident, peak};
}

class ServiceMetrics::Impl {
 public:
  Impl()
      : registry(std::make_shared<prometheus::Registry>()),
        figures(std::make_shared<ScrapeTimeFigures>()),
        phase_seconds(prometheus::BuildHistogram()
                          .Name("strata_phase_seconds")
                          .Help("Time of each job phase run by this process (rollout, score, update, ...).")
                          .Register(*registry)),
        iterations(prometheus::BuildCounter()
                       .Name("strata_iterations_total")
                       .Help("Training iterations the coordinator's job loops completed, by algorithm.")
                       .Register(*registry)),
        iteration_seconds(prometheus::BuildHistogram()
                              .Name("strata_iteration_seconds")
                              .Help("Wall time of whole training iterations, by algorithm.")
                              .Register(*registry)),
        queue_wait(prometheus::BuildHistogram()
                       .Name("strata_job_queue_wait_seconds")
                       .Help("Time a job waited between submission and its first start.")
                       .Register(*registry)
                       .Add({}, kQueueBuckets)),
        rpc_seconds(prometheus::BuildHistogram()
                        .Name("strata_rpc_server_seconds")
                        .Help("Latency of RPCs this process served, by method and status code.")
                        .Register(*registry)),
        redis_errors(prometheus::BuildCounter()
                         .Name("strata_redis_errors_total")
                         .Help("Redis commands that failed (connection, error reply, timeout).")
                         .Register(*registry)
                         .Add({})),
        memory_bytes(prometheus::BuildGauge()
                         .Name("strata_memory_bytes")
                         .Help("Bytes each memory tier holds, as of the end of the last phase.")
                         .Register(*registry)),
        memory_peak_bytes(prometheus::BuildGauge()
                              .Name("strata_memory_phase_peak_bytes")
                              .Help("Peak bytes of each memory tier during the last phase.")
                              .Register(*registry)),
        tokens_per_second(prometheus::BuildGauge()
                              .Name("strata_generation_tokens_per_second")
                              .Help("Decoding rate of the last rollout phase on this process.")
                              .Register(*registry)
                              .Add({})) {}

  std::shared_ptr<prometheus::Registry> registry;
  std::shared_ptr<ScrapeTimeFigures> figures;
  prometheus::Family<prometheus::Histogram>& phase_seconds;
  prometheus::Family<prometheus::Counter>& iterations;
  prometheus::Family<prometheus::Histogram>& iteration_seconds;
  prometheus::Histogram& queue_wait;
  prometheus::Family<prometheus::Histogram>& rpc_seconds;
  prometheus::Counter& redis_errors;
  prometheus::Family<prometheus::Gauge>& memory_bytes;
  prometheus::Family<prometheus::Gauge>& memory_peak_bytes;
  prometheus::Gauge& tokens_per_second;

  std::mutex mu;  // guards exposer
  std::unique_ptr<prometheus::Exposer> exposer;
};

ServiceMetrics::ServiceMetrics() : impl_(std::make_unique<Impl>()) {}
ServiceMetrics::~ServiceMetrics() = default;

ServiceMetrics& ServiceMetrics::Global() {
  // Never destroyed: RPC threads may record while the process exits.
  static ServiceMetrics* metrics = new ServiceMetrics();
  return *metrics;
}

absl::Status ServiceMetrics::Serve(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen: '", listen, "' is not HOST:PORT"));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->exposer != nullptr) return absl::FailedPreconditionError("--metrics-listen: already serving");
  // civetweb's threads need the stack floor (see thread_stack_floor.cc).
  if (ThreadStackFloorBytes() <= 0) return absl::InternalError("no thread stack floor");
  try {
    // Two threads: a scrape is a few kilobytes of text. civetweb's own
    // complaints (why a start failed) go to our log.
    static CivetCallbacks callbacks = [] {
      CivetCallbacks c;
      c.log_message = [](const mg_connection*, const char* message) {
        STRATA_LOG(Warning) << "metrics endpoint: " << message;
        return 1;
      };
      return c;
    }();
    impl_->exposer = std::make_unique<prometheus::Exposer>(listen, 2, &callbacks);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("--metrics-listen: cannot serve on ", listen, ": ", e.what()));
  }
  impl_->exposer->RegisterCollectable(impl_->registry);
  impl_->exposer->RegisterCollectable(impl_->figures);
  return absl::OkStatus();
}

int ServiceMetrics::port() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->exposer == nullptr) return 0;
  const std::vector<int> ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void ServiceMetrics::ObservePhase(const std::string& phase, double seconds, int64_t generated_tokens) {
  impl_->phase_seconds.Add({{"phase", phase}}, kPhaseBuckets).Observe(seconds);
  if (phase == "rollout" && seconds > 0) {
    impl_->tokens_per_second.Set(static_cast<double>(generated_tokens) / seconds);
  }
}

void ServiceMetrics::CountIteration(const std::string& algorithm, double seconds) {
  impl_->iterations.Add({{"algorithm", algorithm}}).Increment();
  impl_->iteration_seconds.Add({{"algorithm", algorithm}}, kPhaseBuckets).Observe(seconds);
}

void ServiceMetrics::ObserveQueueWait(double seconds) { impl_->queue_wait.Observe(seconds); }

void ServiceMetrics::ObserveRpc(const std::string& method, const std::string& code, double seconds) {
  impl_->rpc_seconds.Add({{"method", method}, {"code", code}}, kRpcBuckets).Observe(seconds);
}

void ServiceMetrics::CountRedisError() { impl_->redis_errors.Increment(); }

void ServiceMetrics::SetMemory(const std::string& tier, int64_t in_use_bytes, int64_t phase_peak_bytes) {
  impl_->memory_bytes.Add({{"tier", tier}}).Set(static_cast<double>(in_use_bytes));
  impl_->memory_peak_bytes.Add({{"tier", tier}}).Set(static_cast<double>(phase_peak_bytes));
}

void ServiceMetrics::SetJobStateSource(CountSource source) { impl_->figures->SetJobStateSource(std::move(source)); }

void ServiceMetrics::SetWorkerStateSource(CountSource source) {
  impl_->figures->SetWorkerStateSource(std::move(source));
}

}  // namespace strata::services
