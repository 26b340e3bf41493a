// Times every RPC a server handles, by method and status code, into
// strata_rpc_server_seconds (services/telemetry). Installed on the
// coordinator's and the workers' servers with ServerBuilder.
#ifndef STRATA_SERVICES_RPC_RPC_METRICS_H_
#define STRATA_SERVICES_RPC_RPC_METRICS_H_

#include <grpcpp/server_builder.h>

namespace strata::services {

void AddRpcMetrics(grpc::ServerBuilder& builder);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RPC_RPC_METRICS_H_
