#include "services/store/redis_client.h"

#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <cctype>
#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "services/telemetry/service_metrics.h"

namespace strata::services {
namespace {

timeval ToTimeval(int ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>(ms % 1000) * 1000;
  return tv;
}

}  // namespace

std::string RedisEndpoint::Address() const {
  return absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port);
}

// The URL as it may appear in a message: credentials replaced by "***".
std::string RedactUrl(const std::string& url) {
  const size_t at = url.rfind('@');
  if (at == std::string::npos) return url;
  const size_t scheme = url.find("://");
  const size_t start = scheme == std::string::npos ? 0 : scheme + 3;
  if (at < start) return url;
  return url.substr(0, start) + "***" + url.substr(at);
}

bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

absl::StatusOr<RedisEndpoint> ParseRedisUrl(const std::string& url) {
  auto bad = [&url](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("JobStoreOptions.redis_url \"", RedactUrl(url), "\": ", why,
                                                   " (expected redis://[[user]:password@]host[:port][/db])"));
  };
  constexpr char kScheme[] = "redis://";
  if (!absl::StartsWith(url, kScheme)) return bad("must start with redis://");
  std::string rest = url.substr(sizeof(kScheme) - 1);
  RedisEndpoint endpoint;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    const std::string path = rest.substr(slash + 1);
    rest.resize(slash);
    if (!path.empty()) {
      if (!AllDigits(path) || path.size() > 5) return bad("database must be a small non-negative number");
      endpoint.db = std::stoi(path);
    }
  }
  const size_t at = rest.rfind('@');
  if (at != std::string::npos) {
    const std::string userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = userinfo.find(':');
    if (colon == std::string::npos) return bad("credentials must be [user]:password");
    endpoint.user = userinfo.substr(0, colon);
    endpoint.password = userinfo.substr(colon + 1);
  }
  std::string port;
  if (absl::StartsWith(rest, "[")) {  // IPv6 literal
    const size_t close = rest.find(']');
    if (close == std::string::npos) return bad("unterminated [ in host");
    endpoint.host = rest.substr(1, close - 1);
    const std::string after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("unexpected text after host");
      port = after.substr(1);
      if (port.empty()) return bad("empty port");
    }
  } else {
    const size_t colon = rest.rfind(':');
    endpoint.host = rest.substr(0, colon);
    if (colon != std::string::npos) {
      port = rest.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
  }
  if (endpoint.host.empty()) return bad("missing host");
  for (const unsigned char c : endpoint.host) {
    if (std::isspace(c) || c == '/' || c == '?' || c == '#' || c == '[' || c == ']') {
      return bad("host contains an invalid character");
    }
  }
  if (!port.empty()) {
    if (!AllDigits(port) || port.size() > 5 || std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return bad("port must be a number in 1..65535");
    }
    endpoint.port = std::stoi(port);
  }
  return endpoint;
}

// Error replies that mean "try again later" map to UNAVAILABLE; the rest say
// something a retry will not fix.
absl::Status ErrorReplyToStatus(const std::string& address, const std::string& command, const std::string& error) {
  ServiceMetrics::Global().CountRedisError();
  const std::string kind = error.substr(0, error.find(' '));
  const std::string message = absl::StrCat("redis at ", address, ": ", command, ": ", error);
  if (kind == "LOADING" || kind == "BUSY" || kind == "MASTERDOWN" || kind == "TRYAGAIN" || kind == "CLUSTERDOWN" ||
      kind == "READONLY" || kind == "MISCONF") {
    return absl::UnavailableError(message);
  }
  if (kind == "NOAUTH" || kind == "WRONGPASS") return absl::UnauthenticatedError(message);
  if (kind == "NOPERM") return absl::PermissionDeniedError(message);
  if (kind == "OOM") return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

std::string ReplyString(const redisReply* reply) { return std::string(reply->str, reply->len); }

bool IsStringReply(const redisReply* reply) {
  return reply != nullptr && (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS);
}

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Open(const RedisEndpoint& endpoint,
                                                                       int connect_timeout_ms, int command_timeout_ms) {
  const std::string address = endpoint.Address();
  ContextPtr context(redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, ToTimeval(connect_timeout_ms)));
  if (context == nullptr) return absl::UnavailableError(absl::StrCat("redis at ", address, ": out of memory"));
  if (context->err != 0) {
    ServiceMetrics::Global().CountRedisError();
    return absl::UnavailableError(absl::StrCat("redis at ", address, ": connect: ", context->errstr));
  }
  if (redisSetTimeout(context.get(), ToTimeval(command_timeout_ms)) != REDIS_OK ||
      redisEnableKeepAlive(context.get()) != REDIS_OK) {
    return absl::UnavailableError(absl::StrCat("redis at ", address, ": set socket options: ", context->errstr));
  }
  auto connection = std::unique_ptr<RedisConnection>(new RedisConnection(std::move(context), address));
  if (!endpoint.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!endpoint.user.empty()) auth.push_back(endpoint.user);
    auth.push_back(endpoint.password);
    STRATA_RETURN_IF_ERROR(connection->Command(auth).status());
  }
  if (endpoint.db != 0) {
    STRATA_RETURN_IF_ERROR(connection->Command({"SELECT", std::to_string(endpoint.db)}).status());
  }
  return connection;
}

absl::StatusOr<ReplyPtr> RedisConnection::Raw(const std::vector<std::string>& argv) {
  std::vector<const char*> args;
  std::vector<size_t> lengths;
  args.reserve(argv.size());
  lengths.reserve(argv.size());
  for (const auto& arg : argv) {
    args.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  ReplyPtr reply(static_cast<redisReply*>(
      redisCommandArgv(context_.get(), static_cast<int>(args.size()), args.data(), lengths.data())));
  if (reply == nullptr) return TransportError(argv[0]);
  return reply;
}

absl::StatusOr<ReplyPtr> RedisConnection::Command(const std::vector<std::string>& argv) {
  STRATA_ASSIGN_OR_RETURN(auto reply, Raw(argv));
  if (reply->type == REDIS_REPLY_ERROR) return ErrorReplyToStatus(address_, argv[0], ReplyString(reply.get()));
  return reply;
}

absl::StatusOr<std::vector<ReplyPtr>> RedisConnection::Pipeline(const std::vector<std::vector<std::string>>& commands) {
  for (const auto& argv : commands) {
    std::vector<const char*> args;
    std::vector<size_t> lengths;
    for (const auto& arg : argv) {
      args.push_back(arg.data());
      lengths.push_back(arg.size());
    }
    if (redisAppendCommandArgv(context_.get(), static_cast<int>(args.size()), args.data(), lengths.data()) !=
        REDIS_OK) {
      return TransportError(argv[0]);
    }
  }
  std::vector<ReplyPtr> replies;
  absl::Status first_error;
  for (const auto& argv : commands) {
    void* raw = nullptr;
    if (redisGetReply(context_.get(), &raw) != REDIS_OK || raw == nullptr) return TransportError(argv[0]);
    ReplyPtr reply(static_cast<redisReply*>(raw));
    if (reply->type == REDIS_REPLY_ERROR && first_error.ok()) {
      first_error = ErrorReplyToStatus(address_, argv[0], ReplyString(reply.get()));
    }
    replies.push_back(std::move(reply));
  }
  if (!first_error.ok()) return first_error;
  return replies;
}

absl::Status RedisConnection::SetTimeout(int ms) {
  if (redisSetTimeout(context_.get(), ToTimeval(ms)) != REDIS_OK) return TransportError("set timeout");
  return absl::OkStatus();
}

bool RedisConnection::IdleAndAlive() const {
  if (broken_ || context_->fd < 0) return false;
  pollfd pfd{context_->fd, POLLIN, 0};
  return ::poll(&pfd, 1, 0) == 0;
}

absl::Status RedisConnection::TransportError(const std::string& command) {
  broken_ = true;
  std::string why = context_->err != 0 ? context_->errstr : "no reply";
  // hiredis reports a socket timeout as EAGAIN's text; say what happened.
  if (context_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) why = "timed out";
  ServiceMetrics::Global().CountRedisError();
  return absl::UnavailableError(absl::StrCat("redis at ", address_, ": ", command, ": ", why));
}

ConnectionPool::ConnectionPool(RedisEndpoint endpoint, int connect_timeout_ms, int command_timeout_ms,
                               int max_idle_connections)
    : endpoint_(std::move(endpoint)),
      connect_timeout_ms_(connect_timeout_ms),
      command_timeout_ms_(command_timeout_ms),
      max_idle_(static_cast<size_t>(std::max(0, max_idle_connections))) {}

absl::StatusOr<ConnectionPool::Lease> ConnectionPool::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!idle_.empty()) {
      std::unique_ptr<RedisConnection> connection = std::move(idle_.back());
      idle_.pop_back();
      if (connection->IdleAndAlive()) return Lease(this, std::move(connection));
      STRATA_LOG(Info) << "redis at " << connection->address() << " closed an idle connection; reconnecting";
    }
  }
  STRATA_ASSIGN_OR_RETURN(auto connection, RedisConnection::Open(endpoint_, connect_timeout_ms_, command_timeout_ms_));
  return Lease(this, std::move(connection));
}

void ConnectionPool::Release(std::unique_ptr<RedisConnection> connection) {
  if (connection->broken()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(connection));
}

}  // namespace strata::services
