#include "services/cli/client_commands.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "services/rpc/auth.h"
#include "services/rpc/wire.h"
#include "strata/v1/coordinator.grpc.pb.h"

namespace strata::services {
namespace {

namespace v1 = strata::v1;
using nlohmann::json;

struct Client {
  std::unique_ptr<v1::Coordinator::Stub> stub;
  std::string token;
  int deadline_ms;
  void Prepare(grpc::ClientContext* context, bool deadline = true) const {
    AddBearer(context, token);
    if (deadline) context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  }
};

absl::StatusOr<Client> Connect(const ClientOptions& options) {
  std::string addr = options.addr;
  if (addr.empty()) {
    const char* env = std::getenv("STRATA_ADDR");
    addr = env != nullptr && *env ? env : "127.0.0.1:50051";
  }
  STRATA_ASSIGN_OR_RETURN(auto token, ResolveToken(options.token_file));
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  TlsFiles tls{options.tls_cert, options.tls_key, options.tls_ca};
  STRATA_ASSIGN_OR_RETURN(auto credentials, MakeChannelCredentials(tls));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxClientMessageBytes);
  args.SetMaxSendMessageSize(kMaxClientMessageBytes);
  return Client{v1::Coordinator::NewStub(grpc::CreateCustomChannel(addr, credentials, args)), token,
                options.deadline_ms};
}

absl::Status Call(const grpc::Status& status) { return FromGrpcStatus(status); }

json JobJson(const v1::Job& job) {
  json j{{"id", job.id()},
         {"state", v1::JobState_Name(job.state())},
         {"algorithm", job.algorithm()},
         {"iteration", job.iteration()},
         {"iterations", job.iterations()},
         {"worker", job.worker()},
         {"output_dir", job.output_dir()},
         {"continues", job.continues()},
         {"continued_by", job.continued_by()},
         {"created_unix_ms", job.created_unix_ms()},
         {"started_unix_ms", job.started_unix_ms()},
         {"updated_unix_ms", job.updated_unix_ms()}};
  j["error"] = job.error_code().empty() ? json(nullptr)
                                        : json{{"code", job.error_code()}, {"message", job.error_message()}};
  return j;
}

}  // namespace

absl::StatusOr<std::string> RunSubmit(const ClientOptions& options, const std::string& spec_path,
                                      const std::vector<std::string>& overrides, const std::string& request_id,
                                      const std::string& continue_job_id) {
  STRATA_ASSIGN_OR_RETURN(auto spec, ReadFileToString(spec_path));
  STRATA_ASSIGN_OR_RETURN(auto client, Connect(options));
  v1::SubmitJobRequest request;
  request.set_spec_yaml(spec);
  for (const auto& o : overrides) request.add_overrides(o);
  request.set_request_id(request_id);
  request.set_continue_job_id(continue_job_id);
  v1::Job job;
  grpc::ClientContext context;
  client.Prepare(&context);
  STRATA_RETURN_IF_ERROR(Call(client.stub->SubmitJob(&context, request, &job)));
  return job.id() + "\n";
}

absl::StatusOr<std::string> RunJobs(const ClientOptions& options, const std::string& state, int page_size, bool all) {
  STRATA_ASSIGN_OR_RETURN(auto client, Connect(options));
  v1::ListJobsRequest request;
  request.set_page_size(page_size);
  if (!state.empty()) {
    v1::JobState parsed;
    if (!v1::JobState_Parse(state, &parsed)) {
      return absl::InvalidArgumentError(absl::StrCat("--state: '", state, "' is not a job state"));
    }
    request.set_state(parsed);
  }
  std::string out = absl::StrFormat("%-20s %-10s %-13s %11s  %s\n", "ID", "STATE", "ALGORITHM", "ITERATION", "WORKER");
  do {
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    client.Prepare(&context);
    STRATA_RETURN_IF_ERROR(Call(client.stub->ListJobs(&context, request, &response)));
    for (const auto& job : response.jobs()) {
      out += absl::StrFormat("%-20s %-10s %-13s %5d/%-5d  %s\n", job.id(), v1::JobState_Name(job.state()),
                             job.algorithm(), job.iteration(), job.iterations(), job.worker());
    }
    request.set_page_token(response.next_page_token());
  } while (all && !request.page_token().empty());
  return out;
}

absl::StatusOr<std::string> RunStatus(const ClientOptions& options, const std::string& job_id, bool as_json) {
  STRATA_ASSIGN_OR_RETURN(auto client, Connect(options));
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::ClientContext context;
  client.Prepare(&context);
  STRATA_RETURN_IF_ERROR(Call(client.stub->GetJob(&context, request, &job)));
  if (as_json) return JobJson(job).dump() + "\n";
  std::string out = absl::StrFormat("%s  %s  %s  iteration %d/%d", job.id(), v1::JobState_Name(job.state()),
                                    job.algorithm(), job.iteration(), job.iterations());
  if (!job.error_code().empty()) out += absl::StrFormat("  error %s: %s", job.error_code(), job.error_message());
  return out + "\n";
}

absl::StatusOr<std::string> RunCancel(const ClientOptions& options, const std::string& job_id) {
  STRATA_ASSIGN_OR_RETURN(auto client, Connect(options));
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::ClientContext context;
  client.Prepare(&context);
  STRATA_RETURN_IF_ERROR(Call(client.stub->CancelJob(&context, request, &job)));
  return absl::StrCat(job.id(), " ", v1::JobState_Name(job.state()), "\n");
}

absl::StatusOr<std::string> RunWatch(const ClientOptions& options, const std::string& job_id, std::FILE* progress) {
  STRATA_ASSIGN_OR_RETURN(auto client, Connect(options));
  const bool tty = progress != nullptr && ::isatty(::fileno(progress));
  std::string last_event;
  v1::JobState final_state = v1::JOB_STATE_UNSPECIFIED;
  // A broken stream (coordinator restart) is resumed from the last event.
  for (int attempt = 0; attempt < 30 && final_state == v1::JOB_STATE_UNSPECIFIED; ++attempt) {
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_event_id(last_event);
    grpc::ClientContext context;
    client.Prepare(&context, /*deadline=*/false);
    auto reader = client.stub->WatchJob(&context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      last_event = event.id();
      json j = json::parse(event.json(), nullptr, false);
      if (event.type() == "state") {
        if (progress)
          std::fprintf(progress, "%s%s %s\n", tty ? "\r\033[K" : "", job_id.c_str(),
                       v1::JobState_Name(event.state()).c_str());
        if (event.state() >= v1::SUCCEEDED) final_state = event.state();
      } else if (event.type() == "metrics" && progress && j.is_object()) {
        std::string line = absl::StrFormat("iteration %d", j.value("iteration", int64_t{0}) + 1);
        for (auto [label, key] : {std::pair{"reward", "objective/scores"}, std::pair{"kl", "objective/kl"},
                                  std::pair{"loss", "loss/train_avg"}, std::pair{"eval", "eval/score"},
                                  std::pair{"acc", "eval/pairwise_accuracy"}}) {
          if (j.contains(key) && j[key].is_number()) line += absl::StrFormat(" %s %.3f", label, j[key].get<double>());
        }
        if (j.contains("memory/device_peak_bytes")) {
          line += absl::StrFormat(" dev %.0fMiB host %.0fMiB", j.value("memory/device_peak_bytes", 0.0) / 1048576,
                                  j.value("memory/host_peak_bytes", 0.0) / 1048576);
        }
        line += absl::StrFormat(" %.2f s/it", j.value("time/iteration_s", 0.0));
        std::fprintf(progress, tty ? "\r\033[K%s" : "%s\n", line.c_str());
      } else if (event.type() == "log" && progress && j.is_object()) {
        std::fprintf(progress, "%s%s\n", tty ? "\r\033[K" : "", j.value("message", std::string()).c_str());
      }
      if (progress) std::fflush(progress);
    }
    grpc::Status status = reader->Finish();
    if (final_state != v1::JOB_STATE_UNSPECIFIED) break;
    if (!status.ok() && status.error_code() != grpc::StatusCode::UNAVAILABLE) return FromGrpcStatus(status);
    // UNAVAILABLE: the coordinator is restarting. The channel reconnects by
    // itself; wait a little (30 tries at most) and resume after the last event.
    if (!status.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (final_state != v1::SUCCEEDED) {
    auto status = RunStatus(options, job_id, false);
    return absl::FailedPreconditionError(absl::StrCat("job ended ", v1::JobState_Name(final_state), ": ",
                                                      status.ok() ? *status : std::string(status.status().message())));
  }
  return absl::StrCat(job_id, " SUCCEEDED\n");
}

}  // namespace strata::services
