// Waits for a server's gRPC health to turn SERVING (a worker's does once it
// registered with its coordinator), reading the health stream: no polling.
#ifndef STRATA_TESTS_TESTUTIL_HEALTH_H_
#define STRATA_TESTS_TESTUTIL_HEALTH_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace strata::testing {

inline absl::Status WaitUntilServing(const std::string& address, std::chrono::seconds limit) {
  auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + limit);
  context.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest request;
  auto reader = health->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse response;
  while (reader->Read(&response)) {
    if (response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      context.TryCancel();
      reader->Finish();
      return absl::OkStatus();
    }
  }
  const grpc::Status status = reader->Finish();
  return absl::UnavailableError(absl::StrCat(address, " never turned SERVING: ", status.error_message()));
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTUTIL_HEALTH_H_
