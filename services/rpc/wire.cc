#include "services/rpc/wire.h"

#include <string>

namespace strata::services {
namespace {

constexpr int kMaxStatusCode = 16;  // UNAUTHENTICATED, the last code both define

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  const auto grpc_code = code > 0 && code <= kMaxStatusCode ? static_cast<grpc::StatusCode>(code)
                                                            : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  const auto absl_code = code > 0 && code <= kMaxStatusCode ? static_cast<absl::StatusCode>(code)
                                                            : absl::StatusCode::kUnknown;
  return absl::Status(absl_code, status.error_message());
}

}  // namespace strata::services
