// `strata coordinator` and `strata worker`: the two servers, each with gRPC
// health checking and reflection, keepalive, and a clean shutdown on
// SIGINT / SIGTERM.
#ifndef STRATA_SERVICES_CLI_SERVER_COMMANDS_H_
#define STRATA_SERVICES_CLI_SERVER_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/rpc/auth.h"

namespace strata::services {

struct CoordinatorCommand {
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen;  // HOST:PORT of GET /metrics; "" serves none
  std::string redis = "redis://127.0.0.1:6379";
  // Redis password: from this file, else $STRATA_REDIS_PASSWORD; never in
  // the URL, which `ps` and the logs would show.
  std::string redis_password_file;
  std::string token_file;
  // Tenants instead of one token: "TOKEN TENANT [admin]" lines, and the
  // token workers use (their --token-file).
  std::string tokens_file;
  std::string worker_token_file;
  bool insecure = false;  // allow running without a token
  TlsFiles tls;
  // Bounds forming a gang and each collective in it: how long the ranks of
  // a job wait for one that died or hangs before the job is requeued.
  int collective_timeout_ms = 60000;
};

struct WorkerCommand {
  std::string listen = "127.0.0.1:50061";
  std::string metrics_listen;
  std::string coordinator = "127.0.0.1:50051";
  std::string token_file;
  bool insecure = false;  // allow running without a token
  std::string nvme_dir;
  // Job paths must resolve inside data_root (default: the working
  // directory) or one of allow_paths.
  std::string data_root;
  std::vector<std::string> allow_paths;
  // Hosts remote reward sources may call (HOST[:PORT]) and the bearer
  // tokens they may name (NAME=FILE); none by default.
  std::vector<std::string> allow_reward_hosts;
  std::vector<std::string> reward_secrets;
  int64_t device_budget_mib = 0;
  // Limits the worker enforces itself: memory.host_mib (default 90% of
  // physical memory) and rows per iteration.
  int64_t max_host_mib = 0;
  int64_t max_rows = 4096;
  int64_t max_tokens = int64_t{4} << 20;
  std::string worker_id;  // default: worker-<listen address>
  TlsFiles tls;
};

// Run until SIGINT / SIGTERM; the returned text is printed on exit.
absl::StatusOr<std::string> RunCoordinatorServer(const CoordinatorCommand& command);
absl::StatusOr<std::string> RunWorkerServer(const WorkerCommand& command);

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_SERVER_COMMANDS_H_
