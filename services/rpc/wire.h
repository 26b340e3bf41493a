// What both ends of every gRPC call agree on: the largest message each side
// accepts, and absl::Status <-> grpc::Status (one mapping, so a code means
// the same thing to the services and to their clients).
#ifndef STRATA_SERVICES_RPC_WIRE_H_
#define STRATA_SERVICES_RPC_WIRE_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace strata::services {

// Largest worker message either side accepts; the server builder and the
// client channel both use this. Phase calls carry scalars and text (a
// sample of responses), far below it.
inline constexpr int kMaxWorkerMessageBytes = 512 << 20;
// Largest message between clients and the coordinator, the same on both
// sides: a request carries at most a 1 MiB spec and 1 MiB of overrides
// (more is refused by name), a list page carries summaries without specs.
inline constexpr int kMaxClientMessageBytes = 4 << 20;

// Status codes are numerically the same in Abseil and gRPC; the message is
// kept, payloads are dropped. A code outside 0..16 becomes UNKNOWN.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RPC_WIRE_H_
