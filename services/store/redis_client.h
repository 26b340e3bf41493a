// The Redis client under the job store: URL parsing, one hiredis connection
// with its error mapping, and a pool of them. Private to services/store.
#ifndef STRATA_SERVICES_STORE_REDIS_CLIENT_H_
#define STRATA_SERVICES_STORE_REDIS_CLIENT_H_

#include <hiredis/hiredis.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::services {

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  std::string user;
  std::string password;
  int db = 0;
  // "host:port" ("[v6]:port"): what error messages name, never the credentials.
  std::string Address() const;
};

// redis://[[user]:password@]host[:port][/db]. INVALID_ARGUMENT naming
// JobStoreOptions.redis_url, with the credentials redacted.
absl::StatusOr<RedisEndpoint> ParseRedisUrl(const std::string& url);
// The URL as it may appear in a message: credentials replaced by "***".
std::string RedactUrl(const std::string& url);

// Error replies that mean "try again later" (LOADING, BUSY, READONLY, ...)
// map to UNAVAILABLE, NOAUTH to UNAUTHENTICATED, NOPERM to
// PERMISSION_DENIED, OOM to RESOURCE_EXHAUSTED, the rest to INTERNAL.
absl::Status ErrorReplyToStatus(const std::string& address, const std::string& command, const std::string& error);
std::string ReplyString(const redisReply* reply);
bool IsStringReply(const redisReply* reply);
// True for a non-empty string of ASCII digits.
bool AllDigits(const std::string& s);

// One hiredis connection. Not thread-safe: a caller holds it exclusively
// (through ConnectionPool::Lease). After any transport failure the stream may
// be out of step with the server, so the connection marks itself broken and is
// never reused.
class RedisConnection {
 public:
  // Connects, then AUTH and SELECT as the endpoint asks. UNAVAILABLE when
  // Redis cannot be reached.
  static absl::StatusOr<std::unique_ptr<RedisConnection>> Open(const RedisEndpoint& endpoint, int connect_timeout_ms,
                                                               int command_timeout_ms);
  // Sends one command. UNAVAILABLE on a transport failure (refused, reset,
  // timed out); otherwise the reply, which may be an error reply.
  absl::StatusOr<ReplyPtr> Raw(const std::vector<std::string>& argv);
  // Raw, with error replies turned into a Status.
  absl::StatusOr<ReplyPtr> Command(const std::vector<std::string>& argv);
  // Sends all commands in one round trip; error replies become a Status (the
  // first one wins, after every reply has been read so the stream stays in step).
  absl::StatusOr<std::vector<ReplyPtr>> Pipeline(const std::vector<std::vector<std::string>>& commands);
  absl::Status SetTimeout(int ms);

  bool broken() const { return broken_; }
  const std::string& address() const { return address_; }
  // An idle connection must have nothing to read: readable means the server
  // closed it (restart, idle timeout) or the stream is out of step. Checking
  // before reuse turns a restarted Redis into a fresh connect instead of a
  // failed call.
  bool IdleAndAlive() const;

 private:
  struct ContextDeleter {
    void operator()(redisContext* context) const { redisFree(context); }
  };
  using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

  RedisConnection(ContextPtr context, std::string address)
      : context_(std::move(context)), address_(std::move(address)) {}
  absl::Status TransportError(const std::string& command);

  ContextPtr context_;
  std::string address_;
  bool broken_ = false;
};

// Connections are opened on demand and kept for reuse up to a limit, so
// concurrent calls (a blocking event read among them) never queue behind one
// another. Thread-safe.
class ConnectionPool {
 public:
  ConnectionPool(RedisEndpoint endpoint, int connect_timeout_ms, int command_timeout_ms, int max_idle_connections);

  // Exclusive use of one connection; returned to the pool when destroyed,
  // unless it broke.
  class Lease {
   public:
    Lease(ConnectionPool* pool, std::unique_ptr<RedisConnection> connection)
        : pool_(pool), connection_(std::move(connection)) {}
    ~Lease() {
      if (connection_ != nullptr) pool_->Release(std::move(connection_));
    }
    Lease(Lease&& other) noexcept : pool_(other.pool_), connection_(std::move(other.connection_)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    RedisConnection* operator->() const { return connection_.get(); }

   private:
    ConnectionPool* pool_;
    std::unique_ptr<RedisConnection> connection_;
  };

  // An idle connection that is still alive, or a new one.
  absl::StatusOr<Lease> Acquire();
  int command_timeout_ms() const { return command_timeout_ms_; }

 private:
  void Release(std::unique_ptr<RedisConnection> connection);

  const RedisEndpoint endpoint_;
  const int connect_timeout_ms_;
  const int command_timeout_ms_;
  const size_t max_idle_;
  std::mutex mu_;
  std::vector<std::unique_ptr<RedisConnection>> idle_;  // guarded by mu_
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_STORE_REDIS_CLIENT_H_
