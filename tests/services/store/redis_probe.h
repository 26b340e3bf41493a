// Looks at a test Redis behind the store's back (TTLs, blocked clients).
#ifndef STRATA_TESTS_SERVICES_STORE_REDIS_PROBE_H_
#define STRATA_TESTS_SERVICES_STORE_REDIS_PROBE_H_

#include <hiredis/hiredis.h>

#include <string>
#include <vector>

namespace strata::services {

class RedisProbe {
 public:
  explicit RedisProbe(int port) : context_(redisConnect("127.0.0.1", port)) {}
  ~RedisProbe() {
    if (context_ != nullptr) redisFree(context_);
  }
  RedisProbe(const RedisProbe&) = delete;
  RedisProbe& operator=(const RedisProbe&) = delete;

  // Integer reply of `command`, or -1000 on any failure.
  long long Integer(const std::vector<std::string>& argv) {
    redisReply* reply = Run(argv);
    long long value = (reply != nullptr && reply->type == REDIS_REPLY_INTEGER) ? reply->integer : -1000;
    if (reply != nullptr) freeReplyObject(reply);
    return value;
  }
  std::string String(const std::vector<std::string>& argv) {
    redisReply* reply = Run(argv);
    std::string value = (reply != nullptr && (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS))
                            ? std::string(reply->str, reply->len)
                            : std::string();
    if (reply != nullptr) freeReplyObject(reply);
    return value;
  }

 private:
  redisReply* Run(const std::vector<std::string>& argv) {
    if (context_ == nullptr || context_->err != 0) return nullptr;
    std::vector<const char*> args;
    std::vector<size_t> lengths;
    for (const auto& arg : argv) {
      args.push_back(arg.data());
      lengths.push_back(arg.size());
    }
    return static_cast<redisReply*>(
        redisCommandArgv(context_, static_cast<int>(args.size()), args.data(), lengths.data()));
  }
  redisContext* context_;
};

}  // namespace strata::services

#endif  // STRATA_TESTS_SERVICES_STORE_REDIS_PROBE_H_
