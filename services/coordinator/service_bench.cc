#include "services/coordinator/service_bench.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "services/rpc/auth.h"
#include "services/store/redis_job_store.h"
#include "strata/v1/coordinator.grpc.pb.h"

namespace strata::services {
namespace {

namespace v1 = strata::v1;
using Clock = std::chrono::steady_clock;

class Recorder {
 public:
  void Add(const std::string& call, double ms, const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    samples_[call].push_back(ms);
    if (!error.empty()) {
      ++errors_[call];
      if (error_samples_.size() < 5) error_samples_.push_back(absl::StrCat(call, ": ", error));
    }
  }
  ServiceLoadResult Summarize() {
    std::lock_guard<std::mutex> lock(mu_);
    ServiceLoadResult result;
    for (auto& [call, ms] : samples_) {
      std::sort(ms.begin(), ms.end());
      auto at = [&](double q) {
        return ms.empty() ? 0.0 : ms[std::min(ms.size() - 1, static_cast<size_t>(q * ms.size()))];
      };
      LatencySummary s{static_cast<int64_t>(ms.size()), errors_[call], at(0.5), at(0.9), at(0.99),
                       ms.empty() ? 0 : ms.back()};
      result.total_errors += s.errors;
      result.calls[call] = s;
    }
    result.error_samples = error_samples_;
    return result;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<double>> samples_;
  std::map<std::string, int64_t> errors_;
  std::vector<std::string> error_samples_;
};

double Ms(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

}  // namespace

absl::StatusOr<ServiceLoadResult> RunServiceLoad(const ServiceBenchRequest& r) {
  if (r.clients < 1 || !(r.seconds > 0)) return absl::InvalidArgumentError("--clients >= 1 and --seconds > 0 needed");
  if (r.spec_yaml.empty()) return absl::InvalidArgumentError("--spec: a job spec to submit is required");
  auto channel = grpc::CreateChannel(r.addr, grpc::InsecureChannelCredentials());
  auto stub = v1::Coordinator::NewStub(channel);
  Recorder recorder;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(r.seconds));
  auto context_for = [&](grpc::ClientContext* c, double timeout_s) {
    services::AddBearer(c, r.token);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int>(timeout_s * 1000)));
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < r.clients; ++i) {
    threads.emplace_back([&, i] {
      v1::SubmitJobRequest submit;
      submit.set_spec_yaml(r.spec_yaml);
      submit.set_request_id(absl::StrCat("load-", ::getpid(), "-", i));
      v1::Job job;
      {
        grpc::ClientContext c;
        context_for(&c, 30);
        const auto start = Clock::now();
        const grpc::Status s = stub->SubmitJob(&c, submit, &job);
        recorder.Add("submit", Ms(start), s.ok() ? "" : s.error_message());
        if (!s.ok()) return;
      }
      // A watcher for this client's job for the rest of the run.
      std::thread watcher([&, id = job.id()] {
        v1::WatchJobRequest request;
        request.set_job_id(id);
        grpc::ClientContext c;
        services::AddBearer(&c, r.token);
        c.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::duration_cast<std::chrono::system_clock::duration>(end - Clock::now()));
        auto reader = stub->WatchJob(&c, request);
        v1::JobEvent event;
        auto start = Clock::now();
        while (reader->Read(&event)) {
          recorder.Add("watch_events", Ms(start), "");
          start = Clock::now();
        }
        const grpc::Status s = reader->Finish();
        // Running out of the bounded time is how a watch of a live job ends here.
        if (!s.ok() && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
          recorder.Add("watch_events", Ms(start), s.error_message());
        }
      });
      while (Clock::now() < end) {
        {
          v1::ListJobsRequest list;
          list.set_page_size(20);
          v1::ListJobsResponse response;
          grpc::ClientContext c;
          context_for(&c, 10);
          const auto start = Clock::now();
          const grpc::Status s = stub->ListJobs(&c, list, &response);
          recorder.Add("list", Ms(start), s.ok() ? "" : s.error_message());
        }
        {
          v1::GetJobRequest get;
          get.set_job_id(job.id());
          v1::Job got;
          grpc::ClientContext c;
          context_for(&c, 10);
          const auto start = Clock::now();
          const grpc::Status s = stub->GetJob(&c, get, &got);
          recorder.Add("get", Ms(start), s.ok() ? "" : s.error_message());
        }
      }
      watcher.join();
    });
  }
  for (auto& t : threads) t.join();

  // The peer: the same job reads straight against Redis, same concurrency.
  if (!r.redis.empty()) {
    services::RedisStoreOptions options;
    options.redis_url = r.redis;
    STRATA_ASSIGN_OR_RETURN(auto store, services::ConnectRedisJobStore(options));
    auto page = store->List(1, "", std::nullopt);
    const std::string id = page.ok() && !page->first.empty() ? page->first[0].id : "";
    std::vector<std::thread> peers;
    const auto peer_end = Clock::now() + std::chrono::seconds(2);
    for (int i = 0; i < r.clients; ++i) {
      peers.emplace_back([&] {
        while (Clock::now() < peer_end) {
          const auto start = Clock::now();
          auto got = store->Get(id);
          recorder.Add("store_get", Ms(start), got.ok() ? "" : std::string(got.status().message()));
        }
      });
    }
    for (auto& t : peers) t.join();
  }
  return recorder.Summarize();
}

absl::StatusOr<std::string> RunServiceBench(const ServiceBenchRequest& request) {
  STRATA_ASSIGN_OR_RETURN(auto result, RunServiceLoad(request));
  nlohmann::json j{{"clients", request.clients}, {"seconds", request.seconds}, {"errors", result.total_errors}};
  std::string text = absl::StrFormat("%d clients for %.0f s against %s\n  %-13s %8s %7s %9s %9s %9s %9s\n",
                                     request.clients, request.seconds, request.addr, "call", "calls", "errors",
                                     "p50 ms", "p90 ms", "p99 ms", "max ms");
  for (const auto& [call, s] : result.calls) {
    j[call] = {{"calls", s.calls},   {"errors", s.errors}, {"p50_ms", s.p50_ms},
               {"p90_ms", s.p90_ms}, {"p99_ms", s.p99_ms}, {"max_ms", s.max_ms}};
    text += absl::StrFormat("  %-13s %8d %7d %9.2f %9.2f %9.2f %9.2f\n", call, s.calls, s.errors, s.p50_ms, s.p90_ms,
                            s.p99_ms, s.max_ms);
  }
  for (const auto& e : result.error_samples) text += "  error: " + e + "\n";
  j["error_samples"] = result.error_samples;
  return request.json ? j.dump() + "\n" : text;
}

}  // namespace strata::services
