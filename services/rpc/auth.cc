#include "services/rpc/auth.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "services/rpc/wire.h"

namespace strata::services {
namespace {

std::string Trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat(what, ": ", text.status().message()));
  return *text;
}

// The token of an "authorization: Bearer <token>" header; UNAUTHENTICATED
// when there is none.
absl::StatusOr<std::string> BearerToken(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  const std::string value(it->second.data(), it->second.size());
  const std::string prefix = "Bearer ";
  if (value.compare(0, prefix.size(), prefix) != 0) return absl::UnauthenticatedError("invalid bearer token");
  return value.substr(prefix.size());
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& flag) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat(flag, ": ", path));
  // Like ssh with its keys: a secret others can read is no longer one.
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s: %s is open to group or others (mode %04o); run chmod 600 %s", flag, path, st.st_mode & 07777, path));
  }
  auto text = ReadFileToString(path);
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat(flag, ": ", text.status().message()));
  std::string secret = Trim(*text);
  if (secret.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is empty"));
  return secret;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) { return ReadSecretFile(path, "--token-file"); }

absl::StatusOr<std::string> ResolveToken(const std::string& token_file) {
  if (!token_file.empty()) return ReadTokenFile(token_file);
  const char* env = std::getenv("STRATA_TOKEN");
  return env != nullptr ? Trim(env) : std::string();
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Fold the length difference in and walk the longer string, so the time
  // does not reveal how long a matching prefix is.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

grpc::Status TokenAuthenticator::Check(const grpc::CallbackServerContext* context) const {
  if (token_.empty()) return grpc::Status::OK;
  auto token = BearerToken(context);
  if (!token.ok()) return ToGrpcStatus(token.status());
  if (!ConstantTimeEquals(*token, token_))
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  return grpc::Status::OK;
}

absl::StatusOr<std::map<std::string, Caller>> ReadTokensFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadSecretFile(path, "--tokens-file"));
  std::map<std::string, Caller> callers;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string> words = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens-file: ", path, ":", line_number, ": ", why));
    };
    if (words.size() < 2 || words.size() > 3 || (words.size() == 3 && words[2] != "admin")) {
      return bad("expected TOKEN TENANT [admin]");
    }
    const std::string& tenant = words[1];
    const bool name_ok = !tenant.empty() && tenant.size() <= 64 &&
                         std::all_of(tenant.begin(), tenant.end(), [](char c) {
                           return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
                         });
    if (!name_ok) return bad("tenant names are 1-64 of A-Z a-z 0-9 _ . -");
    Caller caller;
    caller.tenant = tenant;
    caller.admin = words.size() == 3;
    if (!callers.emplace(words[0], caller).second) return bad("this token is given twice");
  }
  if (callers.empty()) return absl::InvalidArgumentError(absl::StrCat("--tokens-file: ", path, " holds no token"));
  return callers;
}

absl::StatusOr<Caller> CallerAuthenticator::Identify(const grpc::CallbackServerContext* context) const {
  if (callers_.empty()) return Caller{"", /*admin=*/true, /*worker=*/true};
  STRATA_ASSIGN_OR_RETURN(const std::string token, BearerToken(context));
  // Every token is compared, each in constant time, so the time taken says
  // nothing about which one (or how much of one) matched.
  const Caller* found = nullptr;
  for (const auto& [known, caller] : callers_) {
    if (ConstantTimeEquals(token, known)) found = &caller;
  }
  if (found == nullptr) return absl::UnauthenticatedError("invalid bearer token");
  return *found;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& tls) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (tls.cert.empty()) return grpc::InsecureServerCredentials();
  STRATA_ASSIGN_OR_RETURN(auto cert, ReadPem(tls.cert, "--tls-cert"));
  STRATA_ASSIGN_OR_RETURN(auto key, ReadPem(tls.key, "--tls-key"));
  grpc::SslServerCredentialsOptions options(tls.ca.empty()
                                                ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_key_cert_pairs.push_back({key, cert});
  if (!tls.ca.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto ca, ReadPem(tls.ca, "--tls-ca"));
    options.pem_root_certs = ca;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const TlsFiles& tls) {
  std::string ca_path = tls.ca;
  if (ca_path.empty()) {
    const char* env = std::getenv("STRATA_TLS_CA");
    if (env != nullptr) ca_path = env;
  }
  if (ca_path.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  STRATA_ASSIGN_OR_RETURN(auto ca, ReadPem(ca_path, "--tls-ca"));
  options.pem_root_certs = ca;
  if (!tls.cert.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto cert, ReadPem(tls.cert, "--tls-cert"));
    STRATA_ASSIGN_OR_RETURN(auto key, ReadPem(tls.key, "--tls-key"));
    options.pem_cert_chain = cert;
    options.pem_private_key = key;
  }
  return grpc::SslCredentials(options);
}

void AddBearer(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
}

}  // namespace strata::services
