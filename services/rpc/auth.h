// Bearer-token authentication for both servers, and client credentials.
// The token comes from a file (--token-file) or STRATA_TOKEN; it is compared
// in constant time. Health checks are served by gRPC's own health service,
// which never reaches these checks.
#ifndef STRATA_SERVICES_RPC_AUTH_H_
#define STRATA_SERVICES_RPC_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace strata::services {

// Reads a secret (a token, a password) from a file, surrounding whitespace
// trimmed. PERMISSION_DENIED naming the file when group or others have any
// access to it, INVALID_ARGUMENT if it is empty, NOT_FOUND if missing; `flag`
// ("--token-file") starts every message.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& flag);
// ReadSecretFile(path, "--token-file").
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The token a command should use: the file if given, else $STRATA_TOKEN, else "".
absl::StatusOr<std::string> ResolveToken(const std::string& token_file);

// True when a and b are equal, in time that depends only on their lengths.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

class TokenAuthenticator {
 public:
  // An empty token turns authentication off (logged as a warning by callers).
  explicit TokenAuthenticator(std::string token) : token_(std::move(token)) {}
  // OK, or UNAUTHENTICATED when the call's `authorization` metadata is not
  // "Bearer <token>".
  grpc::Status Check(const grpc::CallbackServerContext* context) const;
  bool enabled() const { return !token_.empty(); }

 private:
  const std::string token_;
};

// Who a call comes from, as its bearer token says.
struct Caller {
  std::string tenant;   // whose jobs it sees and owns; "" for a worker
  bool admin = false;   // sees and cancels every tenant's jobs
  bool worker = false;  // may register and heartbeat as a worker
};

// A tokens file: one "TOKEN TENANT" or "TOKEN TENANT admin" per line, blank
// lines and "#" comments ignored; private like any secret (ReadSecretFile's
// rules). Tenant names are [A-Za-z0-9_.-]{1,64}. INVALID_ARGUMENT naming the
// file and line for anything else, and for a token given twice.
absl::StatusOr<std::map<std::string, Caller>> ReadTokensFile(const std::string& path);

// Identifies callers by bearer token. With no tokens, authentication is off
// and every caller is an admin and a worker.
class CallerAuthenticator {
 public:
  explicit CallerAuthenticator(std::map<std::string, Caller> callers) : callers_(std::move(callers)) {}
  // UNAUTHENTICATED when the `authorization` metadata holds no known token.
  absl::StatusOr<Caller> Identify(const grpc::CallbackServerContext* context) const;

 private:
  const std::map<std::string, Caller> callers_;
};

struct TlsFiles {
  std::string cert;  // PEM server certificate chain
  std::string key;   // PEM private key
  std::string ca;    // PEM CA for verifying peers (clients: the server; servers: client certs, mTLS)
};

// Insecure unless cert and key are given; with `ca` as well, clients must
// present certificates signed by it (mTLS).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& tls);
// Insecure unless a CA (or $STRATA_TLS_CA) is given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const TlsFiles& tls);

// Adds "authorization: Bearer <token>" to a client call when token is set.
void AddBearer(grpc::ClientContext* context, const std::string& token);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RPC_AUTH_H_
