// The client side of the job service: `strata submit | jobs | status |
// watch | cancel`. A failed call returns its gRPC status (main prints the
// code name and message and exits non-zero).
#ifndef STRATA_SERVICES_CLI_CLIENT_COMMANDS_H_
#define STRATA_SERVICES_CLI_CLIENT_COMMANDS_H_

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::services {

struct ClientOptions {
  std::string addr;        // --addr, else $STRATA_ADDR, else 127.0.0.1:50051
  std::string token_file;  // --token-file, else $STRATA_TOKEN
  std::string tls_ca;      // --tls-ca, else $STRATA_TLS_CA; empty: plaintext
  std::string tls_cert;    // --tls-cert / --tls-key: this client's certificate, for a coordinator
  std::string tls_key;     // that requires one (mTLS)
  int deadline_ms = 30000;
};

// `continue_job_id`: an ended (FAILED or CANCELLED) job this one continues
// from its newest checkpoint; "" for a fresh job.
absl::StatusOr<std::string> RunSubmit(const ClientOptions& client, const std::string& spec_path,
                                      const std::vector<std::string>& overrides, const std::string& request_id,
                                      const std::string& continue_job_id = "");
absl::StatusOr<std::string> RunJobs(const ClientOptions& client, const std::string& state, int page_size, bool all);
absl::StatusOr<std::string> RunStatus(const ClientOptions& client, const std::string& job_id, bool json);
absl::StatusOr<std::string> RunCancel(const ClientOptions& client, const std::string& job_id);
// Streams events with a progress bar to `progress`; OK only when the job
// SUCCEEDED (FAILED_PRECONDITION naming the end state otherwise).
absl::StatusOr<std::string> RunWatch(const ClientOptions& client, const std::string& job_id, std::FILE* progress);

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_CLIENT_COMMANDS_H_
