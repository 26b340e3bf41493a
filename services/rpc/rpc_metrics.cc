#include "services/rpc/rpc_metrics.h"

#include <grpcpp/support/server_interceptor.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "services/telemetry/service_metrics.h"

namespace strata::services {
namespace {

namespace exp = grpc::experimental;

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "OTHER";
  }
}

// "/strata.v1.Coordinator/SubmitJob" -> "Coordinator/SubmitJob": the
// package adds nothing, and the label stays short.
std::string MethodLabel(const char* full) {
  std::string method = full == nullptr ? "" : full;
  const size_t slash = method.rfind('/');
  if (slash == std::string::npos || slash == 0) return method;
  const size_t dot = method.rfind('.', slash);
  const size_t start = dot == std::string::npos ? 1 : dot + 1;
  return method.substr(start);
}

// One per RPC: gRPC creates it as the call arrives and deletes it at the end.
class RpcTimer final : public exp::Interceptor {
 public:
  explicit RpcTimer(exp::ServerRpcInfo* info)
      : method_(MethodLabel(info->method())), started_(std::chrono::steady_clock::now()) {}

  void Intercept(exp::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(exp::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      ServiceMetrics::Global().ObserveRpc(method_, CodeName(methods->GetSendStatus().error_code()), seconds);
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  const std::chrono::steady_clock::time_point started_;
};

class RpcTimerFactory final : public exp::ServerInterceptorFactoryInterface {
 public:
  exp::Interceptor* CreateServerInterceptor(exp::ServerRpcInfo* info) override { return new RpcTimer(info); }
};

}  // namespace

void AddRpcMetrics(grpc::ServerBuilder& builder) {
  std::vector<std::unique_ptr<exp::ServerInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<RpcTimerFactory>());
  builder.experimental().SetInterceptorCreators(std::move(factories));
}

}  // namespace strata::services
