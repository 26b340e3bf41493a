#include "services/store/job_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "services/store/redis_client.h"

namespace strata::services {
namespace {

constexpr std::array<JobState, 5> kAllStates = {JobState::kQueued, JobState::kRunning, JobState::kSucceeded,
                                                JobState::kFailed, JobState::kCancelled};
constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;
constexpr int kDefaultEventCount = 100;
constexpr int kMaxEventCount = 10000;
// ListByState fetches job hashes in pipelined batches of this many.
constexpr size_t kFetchBatch = 256;
constexpr size_t kMaxIdLength = 128;
constexpr size_t kMaxRequestIdLength = 256;

// Every script returns {tag, ...}: "OK" with its result, or a tag the caller
// turns into a Status. Timestamps come from the Redis server clock so that
// several coordinators agree on ordering.
constexpr char kNowLua[] =
    "local t = redis.call('TIME')\n"
    "local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))\n";

enum ScriptId { kCreateScript, kTransitionScript, kProgressScript, kCheckpointScript, kAppendEventScript,
                kRegisterWorkerScript, kHeartbeatScript, kListWorkersScript, kNumScripts };

// KEYS: job, request, jobs, jobs:state:QUEUED, jobs:seq, the continued job
// (the job itself when none).
// ARGV: id, has_request ("1"/"0"), continued job id or "", field, value, ...
// A continued job must have ended FAILED or CANCELLED and not be continued
// yet; it is marked continued_by in the same step, so it is continued once.
constexpr char kCreateLua[] = R"lua(
if ARGV[2] == '1' then
  local existing = redis.call('GET', KEYS[2])
  if existing then return {'EXISTS', existing} end
end
if ARGV[3] ~= '' then
  local ended = redis.call('HGET', KEYS[6], 'state')
  if not ended then return {'CONTINUE_NOT_FOUND'} end
  if ended ~= 'FAILED' and ended ~= 'CANCELLED' then return {'CONTINUE_STATE', ended} end
  local by = redis.call('HGET', KEYS[6], 'continued_by')
  if by and by ~= '' then return {'CONTINUED', by} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'COLLISION'} end
local seq = redis.call('INCR', KEYS[5])
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[6], 'continued_by', ARGV[1]) end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'state', 'QUEUED', 'seq', tostring(seq), 'created_unix_ms', now,
           'updated_unix_ms', now, 'error_code', '', 'error_message', '')
redis.call('ZADD', KEYS[3], seq, ARGV[1])
redis.call('ZADD', KEYS[4], seq, ARGV[1])
if ARGV[2] == '1' then redis.call('SET', KEYS[2], ARGV[1]) end
return {'OK', redis.call('HGETALL', KEYS[1])}
)lua";

// KEYS: job, jobs:state:QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED.
// ARGV: to, n_from, from_1..from_n, n_expect, (field, value) * n_expect,
// field, value, ...
constexpr char kTransitionLua[] = R"lua(
local cur = redis.call('HGET', KEYS[1], 'state')
if not cur then return {'NOT_FOUND'} end
local slot = {QUEUED = 2, RUNNING = 3, SUCCEEDED = 4, FAILED = 5, CANCELLED = 6}
if slot[cur] == nil then return {'CORRUPT', cur} end
if cur == 'SUCCEEDED' or cur == 'FAILED' or cur == 'CANCELLED' then return {'STATE', cur} end
local n_from = tonumber(ARGV[2])
local allowed = false
for i = 3, 2 + n_from do
  if ARGV[i] == cur then allowed = true end
end
if not allowed then return {'STATE', cur} end
local at = 3 + n_from
local n_expect = tonumber(ARGV[at])
for i = at + 1, at + 2 * n_expect, 2 do
  if (redis.call('HGET', KEYS[1], ARGV[i]) or '') ~= ARGV[i + 1] then
    return {'MOVED', cur, ARGV[i], redis.call('HGET', KEYS[1], ARGV[i]) or ''}
  end
end
local to = ARGV[1]
for i = at + 1 + 2 * n_expect, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[1], 'state', to, 'updated_unix_ms', now)
local first_start = 0
if to == 'RUNNING' then first_start = redis.call('HSETNX', KEYS[1], 'started_unix_ms', now) end
if to ~= cur then
  local id = redis.call('HGET', KEYS[1], 'id')
  local seq = redis.call('HGET', KEYS[1], 'seq')
  redis.call('ZREM', KEYS[slot[cur]], id)
  redis.call('ZADD', KEYS[slot[to]], seq, id)
end
return {'OK', redis.call('HGETALL', KEYS[1]), first_start}
)lua";

// KEYS: job. ARGV: iteration.
constexpr char kProgressLua[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOT_FOUND'} end
redis.call('HSET', KEYS[1], 'iteration', ARGV[1], 'updated_unix_ms', now)
return {'OK'}
)lua";

// KEYS: job, job:checkpoints. ARGV: iteration, dir.
constexpr char kCheckpointLua[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOT_FOUND'} end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local best = tonumber(redis.call('HGET', KEYS[1], 'checkpoint_iteration') or '0') or 0
local dir = redis.call('HGET', KEYS[1], 'checkpoint_dir')
if (not dir) or dir == '' or tonumber(ARGV[1]) >= best then
  redis.call('HSET', KEYS[1], 'checkpoint_iteration', ARGV[1], 'checkpoint_dir', ARGV[2])
end
redis.call('HSET', KEYS[1], 'updated_unix_ms', now)
return {'OK'}
)lua";

// KEYS: job, job:events. ARGV: max_len, type, json.
constexpr char kAppendEventLua[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOT_FOUND'} end
return {'OK', redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'type', ARGV[2], 'json', ARGV[3])}
)lua";

// KEYS: worker, workers. ARGV: id, address, job_id, ttl_ms.
constexpr char kRegisterWorkerLua[] = R"lua(
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'address', ARGV[2], 'job_id', ARGV[3], 'last_heartbeat_unix_ms', now)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SADD', KEYS[2], ARGV[1])
return {'OK'}
)lua";

// KEYS: worker, workers. ARGV: id, job_id, ttl_ms.
constexpr char kHeartbeatLua[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOT_FOUND'} end
redis.call('HSET', KEYS[1], 'job_id', ARGV[2], 'last_heartbeat_unix_ms', now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return {'OK'}
)lua";

// KEYS: workers. ARGV: worker key prefix. The worker keys are built inside
// the script (not declared in KEYS), which standalone Redis allows; expired
// registrations are dropped from the set as they are found.
constexpr char kListWorkersLua[] = R"lua(
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local h = redis.call('HGETALL', ARGV[1] .. id)
  if #h == 0 then redis.call('SREM', KEYS[1], id) else table.insert(out, h) end
end
return {'OK', out}
)lua";

std::string ScriptSource(ScriptId id) {
  switch (id) {
    case kCreateScript: return absl::StrCat(kNowLua, kCreateLua);
    case kTransitionScript: return absl::StrCat(kNowLua, kTransitionLua);
    case kProgressScript: return absl::StrCat(kNowLua, kProgressLua);
    case kCheckpointScript: return absl::StrCat(kNowLua, kCheckpointLua);
    case kAppendEventScript: return kAppendEventLua;
    case kRegisterWorkerScript: return absl::StrCat(kNowLua, kRegisterWorkerLua);
    case kHeartbeatScript: return absl::StrCat(kNowLua, kHeartbeatLua);
    case kListWorkersScript: return kListWorkersLua;
    case kNumScripts: break;
  }
  return "";
}

// Ids become part of keys; keeping them to a plain alphabet means an id can
// never name another job's sub-key ("x:events").
absl::Status ValidateId(const std::string& what, const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (id.size() > kMaxIdLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is longer than ", kMaxIdLength, " bytes"));
  }
  for (const unsigned char c : id) {
    if (!std::isalnum(c) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " \"", absl::CHexEscape(id), "\" may contain only letters, digits, '-', '_' and '.'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkerId(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("worker id is empty");
  if (id.size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("worker id is longer than ", kMaxRequestIdLength, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTtl(int ttl_ms) {
  if (ttl_ms <= 0) return absl::InvalidArgumentError(absl::StrCat("ttl_ms must be positive, got ", ttl_ms));
  return absl::OkStatus();
}

std::string NewJobId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "job-";
  uint64_t bits = rng();
  for (int i = 0; i < 12; ++i) {
    id.push_back(kHex[bits & 0xf]);
    bits >>= 4;
  }
  return id;
}

// A flat [field, value, ...] array reply as a map. INTERNAL for anything else.
absl::StatusOr<std::map<std::string, std::string>> HashFromReply(const redisReply* reply, const std::string& what) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements % 2 != 0) {
    return absl::InternalError(absl::StrCat("unexpected reply shape for ", what));
  }
  std::map<std::string, std::string> hash;
  for (size_t i = 0; i < reply->elements; i += 2) {
    if (!IsStringReply(reply->element[i]) || !IsStringReply(reply->element[i + 1])) {
      return absl::InternalError(absl::StrCat("non-string hash entry in ", what));
    }
    hash[ReplyString(reply->element[i])] = ReplyString(reply->element[i + 1]);
  }
  return hash;
}

absl::Status ParseInt(const std::map<std::string, std::string>& hash, const std::string& field, const std::string& what,
                      int64_t* out) {
  const auto it = hash.find(field);
  if (it == hash.end() || it->second.empty()) {
    *out = 0;
    return absl::OkStatus();
  }
  if (!absl::SimpleAtoi(it->second, out)) {
    return absl::InternalError(absl::StrCat(what, " field ", field, " is not an integer: \"", it->second, "\""));
  }
  return absl::OkStatus();
}

std::string Field(const std::map<std::string, std::string>& hash, const std::string& field) {
  const auto it = hash.find(field);
  return it == hash.end() ? std::string() : it->second;
}

absl::StatusOr<JobRecord> JobFromReply(const redisReply* reply, const std::string& what) {
  STRATA_ASSIGN_OR_RETURN(auto hash, HashFromReply(reply, what));
  JobRecord job;
  job.id = Field(hash, "id");
  auto state = ParseJobState(Field(hash, "state"));
  if (!state.ok()) return absl::InternalError(absl::StrCat(what, " has a bad state: ", state.status().message()));
  job.state = *state;
  job.algorithm = Field(hash, "algorithm");
  job.name = Field(hash, "name");
  job.spec_yaml = Field(hash, "spec_yaml");
  job.output_dir = Field(hash, "output_dir");
  job.error_code = Field(hash, "error_code");
  job.error_message = Field(hash, "error_message");
  job.worker = Field(hash, "worker");
  job.request_id = Field(hash, "request_id");
  job.tenant = Field(hash, "tenant");
  job.checkpoint_dir = Field(hash, "checkpoint_dir");
  job.continued_by = Field(hash, "continued_by");
  const std::string resumable = Field(hash, "resumable_run_ids");
  if (!resumable.empty()) job.resumable_run_ids = absl::StrSplit(resumable, ',');
  for (const auto& [field, out] : {std::pair<const char*, int64_t*>{"iteration", &job.iteration},
                                   {"iterations", &job.iterations},
                                   {"created_unix_ms", &job.created_unix_ms},
                                   {"updated_unix_ms", &job.updated_unix_ms},
                                   {"started_unix_ms", &job.started_unix_ms},
                                   {"checkpoint_iteration", &job.checkpoint_iteration}}) {
    STRATA_RETURN_IF_ERROR(ParseInt(hash, field, what, out));
  }
  return job;
}

// The first element of a script's {tag, ...} reply.
absl::StatusOr<std::string> ScriptTag(const redisReply* reply, const std::string& script) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements == 0 ||
      !IsStringReply(reply->element[0])) {
    return absl::InternalError(absl::StrCat("unexpected reply from the ", script, " script"));
  }
  return ReplyString(reply->element[0]);
}

absl::Status JobNotFound(const std::string& id) { return absl::NotFoundError(absl::StrCat("job ", id, " not found")); }

// Stream ids are "<ms>" or "<ms>-<seq>"; anything else would reach Redis as an
// error reply, which is not the caller's fault to retry.
bool IsStreamId(const std::string& id) {
  const size_t dash = id.find('-');
  if (dash == std::string::npos) return AllDigits(id);
  return AllDigits(id.substr(0, dash)) && AllDigits(id.substr(dash + 1));
}

constexpr char kPageTokenPrefix[] = "seq:";

std::string EncodePageToken(int64_t seq) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, seq));
}

absl::StatusOr<int64_t> DecodePageToken(const std::string& token) {
  std::string plain;
  int64_t seq = 0;
  if (!absl::WebSafeBase64Unescape(token, &plain) || !absl::StartsWith(plain, kPageTokenPrefix) ||
      !absl::SimpleAtoi(plain.substr(sizeof(kPageTokenPrefix) - 1), &seq) || seq <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_token \"", absl::CHexEscape(token), "\" is not valid"));
  }
  return seq;
}

}  // namespace

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kQueued: return "QUEUED";
    case JobState::kRunning: return "RUNNING";
    case JobState::kSucceeded: return "SUCCEEDED";
    case JobState::kFailed: return "FAILED";
    case JobState::kCancelled: return "CANCELLED";
  }
  return "UNKNOWN";
}

absl::StatusOr<JobState> ParseJobState(const std::string& name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  for (const JobState state : kAllStates) {
    if (upper == JobStateName(state)) return state;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown job state \"", absl::CHexEscape(name),
                                                 "\" (expected QUEUED, RUNNING, SUCCEEDED, FAILED or CANCELLED)"));
}

bool IsTerminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed || state == JobState::kCancelled;
}

absl::Status JobStoreOptions::Validate() const {
  if (auto endpoint = ParseRedisUrl(redis_url); !endpoint.ok()) return endpoint.status();
  if (connect_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("JobStoreOptions.connect_timeout_ms must be positive, got ", connect_timeout_ms));
  }
  if (command_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("JobStoreOptions.command_timeout_ms must be positive, got ", command_timeout_ms));
  }
  if (max_idle_connections < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("JobStoreOptions.max_idle_connections must not be negative, got ", max_idle_connections));
  }
  if (max_events_per_job <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("JobStoreOptions.max_events_per_job must be positive, got ", max_events_per_job));
  }
  return absl::OkStatus();
}

class JobStore::Impl {
 public:
  Impl(const JobStoreOptions& options, RedisEndpoint endpoint)
      : options_(options), address_(endpoint.Address()), pool_(std::move(endpoint), options.connect_timeout_ms, options.command_timeout_ms,
              options.max_idle_connections) {}

  // Loads every script once so calls can use EVALSHA; also proves Redis answers.
  absl::Status LoadScripts() {
    STRATA_ASSIGN_OR_RETURN(auto lease, pool_.Acquire());
    for (int i = 0; i < kNumScripts; ++i) {
      STRATA_ASSIGN_OR_RETURN(auto reply, lease->Command({"SCRIPT", "LOAD", ScriptSource(static_cast<ScriptId>(i))}));
      if (!IsStringReply(reply.get())) return Unexpected("SCRIPT LOAD");
      shas_[i] = ReplyString(reply.get());
    }
    return absl::OkStatus();
  }

  std::string Key(const std::string& suffix) const { return options_.key_prefix + suffix; }
  std::string JobKey(const std::string& id) const { return Key("job:" + id); }
  std::string StateKey(JobState state) const { return Key(absl::StrCat("jobs:state:", JobStateName(state))); }
  std::string WorkerKey(const std::string& id) const { return Key("worker:" + id); }

  absl::Status Unexpected(const std::string& command) const {
    return absl::InternalError(absl::StrCat("redis at ", address_, ": unexpected reply to ", command));
  }

  absl::StatusOr<ReplyPtr> Command(const std::vector<std::string>& argv) {
    STRATA_ASSIGN_OR_RETURN(auto lease, pool_.Acquire());
    return lease->Command(argv);
  }

  absl::StatusOr<std::vector<ReplyPtr>> Pipeline(const std::vector<std::vector<std::string>>& commands) {
    STRATA_ASSIGN_OR_RETURN(auto lease, pool_.Acquire());
    return lease->Pipeline(commands);
  }

  // EVALSHA, falling back to EVAL when the server has lost its script cache
  // (a restart); NOSCRIPT means the script did not run, so this never runs it twice.
  absl::StatusOr<ReplyPtr> RunScript(ScriptId script, const std::vector<std::string>& keys,
                                     const std::vector<std::string>& args) {
    STRATA_ASSIGN_OR_RETURN(auto lease, pool_.Acquire());
    std::vector<std::string> argv = {"EVALSHA", shas_[script], std::to_string(keys.size())};
    argv.insert(argv.end(), keys.begin(), keys.end());
    argv.insert(argv.end(), args.begin(), args.end());
    auto reply = lease->Raw(argv);
    if (!reply.ok()) return reply.status();
    if ((*reply)->type == REDIS_REPLY_ERROR && absl::StartsWith(ReplyString(reply->get()), "NOSCRIPT")) {
      argv[0] = "EVAL";
      argv[1] = ScriptSource(script);
      reply = lease->Raw(argv);
      if (!reply.ok()) return reply.status();
    }
    if ((*reply)->type == REDIS_REPLY_ERROR) return ErrorReplyToStatus(address_, "EVALSHA", ReplyString(reply->get()));
    return reply;
  }

  // Fetches the job hashes for `ids` in pipelined batches; ids whose hash has
  // vanished are skipped.
  absl::StatusOr<std::vector<JobRecord>> FetchJobs(const std::vector<std::string>& ids) {
    std::vector<JobRecord> jobs;
    jobs.reserve(ids.size());
    for (size_t begin = 0; begin < ids.size(); begin += kFetchBatch) {
      const size_t end = std::min(ids.size(), begin + kFetchBatch);
      std::vector<std::vector<std::string>> commands;
      for (size_t i = begin; i < end; ++i) commands.push_back({"HGETALL", JobKey(ids[i])});
      STRATA_ASSIGN_OR_RETURN(auto replies, Pipeline(commands));
      for (size_t i = begin; i < end; ++i) {
        const redisReply* reply = replies[i - begin].get();
        if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 0) continue;
        STRATA_ASSIGN_OR_RETURN(auto job, JobFromReply(reply, "job " + ids[i]));
        jobs.push_back(std::move(job));
      }
    }
    return jobs;
  }

  // Member ids of a ZRANGE-style reply, with scores when `with_scores`.
  absl::Status ParseIds(const redisReply* reply, bool with_scores, std::vector<std::string>* ids,
                        std::vector<int64_t>* scores, const std::string& command) const {
    if (reply->type != REDIS_REPLY_ARRAY) return Unexpected(command);
    const size_t step = with_scores ? 2 : 1;
    if (reply->elements % step != 0) return Unexpected(command);
    for (size_t i = 0; i < reply->elements; i += step) {
      if (!IsStringReply(reply->element[i])) return Unexpected(command);
      ids->push_back(ReplyString(reply->element[i]));
      if (with_scores) {
        int64_t score = 0;
        if (!IsStringReply(reply->element[i + 1]) || !absl::SimpleAtoi(ReplyString(reply->element[i + 1]), &score)) {
          return Unexpected(command);
        }
        scores->push_back(score);
      }
    }
    return absl::OkStatus();
  }

  const JobStoreOptions options_;
  const std::string address_;
  ConnectionPool pool_;
  std::array<std::string, kNumScripts> shas_;  // set once by LoadScripts, read-only after
};

JobStore::JobStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JobStore::~JobStore() = default;

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Connect(const JobStoreOptions& options) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  STRATA_ASSIGN_OR_RETURN(auto endpoint, ParseRedisUrl(options.redis_url));
  if (!options.password.empty()) endpoint.password = options.password;
  auto impl = std::make_unique<Impl>(options, std::move(endpoint));
  STRATA_RETURN_IF_ERROR(impl->LoadScripts());
  STRATA_LOG(Info) << "job store connected to redis at " << impl->address_ << " (key prefix \"" << options.key_prefix
                   << "\")";
  return std::unique_ptr<JobStore>(new JobStore(std::move(impl)));
}

absl::StatusOr<JobRecord> JobStore::Create(JobRecord job, bool* created) {
  if (created != nullptr) *created = false;
  if (job.request_id.size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("request_id is longer than ", kMaxRequestIdLength, " bytes"));
  }
  const bool has_request = !job.request_id.empty();
  const std::vector<std::pair<const char*, std::string>> fields = {
      {"algorithm", job.algorithm},
      {"name", job.name},
      {"spec_yaml", job.spec_yaml},
      {"output_dir", job.output_dir},
      {"iteration", std::to_string(job.iteration)},
      {"iterations", std::to_string(job.iterations)},
      {"worker", job.worker},
      {"request_id", job.request_id},
      {"tenant", job.tenant},
      {"checkpoint_dir", job.checkpoint_dir},
      {"checkpoint_iteration", std::to_string(job.checkpoint_iteration)},
      {"resumable_run_ids", absl::StrJoin(job.resumable_run_ids, ",")},
  };
  const std::string continued = job.continues();
  for (const std::string& run : job.resumable_run_ids) STRATA_RETURN_IF_ERROR(ValidateId("resumable run id", run));
  // Tenants' idempotency keys live apart: one tenant's request id never
  // returns another's job.
  const std::string request_key =
      impl_->Key(job.tenant.empty() ? "request:" + job.request_id : "request:" + job.tenant + ":" + job.request_id);
  // A random id can collide with an existing one (48 bits); the script
  // refuses to overwrite, and a few fresh draws make a repeat vanishingly rare.
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::string id = NewJobId();
    std::vector<std::string> args = {id, has_request ? "1" : "0", continued};
    for (const auto& [field, value] : fields) {
      args.push_back(field);
      args.push_back(value);
    }
    auto reply = impl_->RunScript(kCreateScript,
                                  {impl_->JobKey(id), request_key, impl_->Key("jobs"),
                                   impl_->StateKey(JobState::kQueued), impl_->Key("jobs:seq"),
                                   impl_->JobKey(continued.empty() ? id : continued)},
                                  args);
    if (!reply.ok()) return reply.status();
    STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply->get(), "create"));
    if (tag == "COLLISION") continue;
    if (tag == "CONTINUE_NOT_FOUND") return JobNotFound(continued);
    if ((tag == "CONTINUE_STATE" || tag == "CONTINUED") && (*reply)->elements >= 2 &&
        IsStringReply((*reply)->element[1])) {
      const std::string detail = ReplyString((*reply)->element[1]);
      return absl::FailedPreconditionError(
          tag == "CONTINUED"
              ? absl::StrCat("job ", continued, " is continued already, by job ", detail,
                             " (an ended job is continued once; continue ", detail, " if it ended too)")
              : absl::StrCat("job ", continued, " is ", detail,
                             "; only a FAILED or CANCELLED job can be continued (cancel a running one first)"));
    }
    if (tag == "EXISTS") {
      if ((*reply)->elements < 2 || !IsStringReply((*reply)->element[1])) return impl_->Unexpected("create");
      const std::string existing = ReplyString((*reply)->element[1]);
      auto existing_job = Get(existing);
      if (!existing_job.ok() && absl::IsNotFound(existing_job.status())) {
        return absl::InternalError(absl::StrCat("request_id ", job.request_id, " names job ", existing,
                                                ", which no longer exists"));
      }
      return existing_job;
    }
    if (tag != "OK" || (*reply)->elements < 2) return impl_->Unexpected("create");
    STRATA_ASSIGN_OR_RETURN(auto stored, JobFromReply((*reply)->element[1], "job " + id));
    if (created != nullptr) *created = true;
    return stored;
  }
  return absl::InternalError("could not draw an unused job id in 5 attempts");
}

absl::StatusOr<JobRecord> JobStore::Get(const std::string& id) {
  STRATA_RETURN_IF_ERROR(ValidateId("job id", id));
  STRATA_ASSIGN_OR_RETURN(auto reply, impl_->Command({"HGETALL", impl_->JobKey(id)}));
  if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 0) return JobNotFound(id);
  return JobFromReply(reply.get(), "job " + id);
}

absl::StatusOr<std::pair<std::vector<JobRecord>, std::string>> JobStore::List(int page_size,
                                                                              const std::string& page_token,
                                                                              std::optional<JobState> state) {
  if (page_size < 0) return absl::InvalidArgumentError(absl::StrCat("page_size must not be negative, got ", page_size));
  if (page_size == 0) page_size = kDefaultPageSize;
  page_size = std::min(page_size, kMaxPageSize);
  // Pages are cut by creation sequence, not offset, so jobs created between
  // calls neither repeat nor push entries off a page.
  std::string max = "+inf";
  if (!page_token.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto seq, DecodePageToken(page_token));
    max = absl::StrCat("(", seq);
  }
  const std::string key = state.has_value() ? impl_->StateKey(*state) : impl_->Key("jobs");
  // One extra entry tells whether another page exists.
  auto reply = impl_->Command(
      {"ZREVRANGEBYSCORE", key, max, "-inf", "WITHSCORES", "LIMIT", "0", std::to_string(page_size + 1)});
  if (!reply.ok()) return reply.status();
  std::vector<std::string> ids;
  std::vector<int64_t> seqs;
  STRATA_RETURN_IF_ERROR(impl_->ParseIds(reply->get(), true, &ids, &seqs, "ZREVRANGEBYSCORE"));
  std::string next_token;
  if (ids.size() > static_cast<size_t>(page_size)) {
    ids.resize(page_size);
    next_token = EncodePageToken(seqs[page_size - 1]);
  }
  STRATA_ASSIGN_OR_RETURN(auto jobs, impl_->FetchJobs(ids));
  return std::make_pair(std::move(jobs), std::move(next_token));
}

absl::StatusOr<JobRecord> JobStore::Transition(const std::string& id, std::vector<JobState> from, JobState to,
                                               const std::map<std::string, std::string>& fields,
                                               const std::map<std::string, std::string>& expect) {
  STRATA_RETURN_IF_ERROR(ValidateId("job id", id));
  if (from.empty()) return absl::InvalidArgumentError("Transition: `from` lists no states");
  std::vector<std::string> args = {JobStateName(to), std::to_string(from.size())};
  for (const JobState state : from) args.push_back(JobStateName(state));
  args.push_back(std::to_string(expect.size()));
  for (const auto& [field, value] : expect) {
    if (field != "worker") {
      return absl::InvalidArgumentError(
          absl::StrCat("Transition: field \"", absl::CHexEscape(field), "\" cannot be expected (only worker)"));
    }
    args.push_back(field);
    args.push_back(value);
  }
  for (const auto& [field, value] : fields) {
    // The state, ids, sequence and timestamps belong to the store; only
    // fields a worker or the scheduler legitimately reports may ride along.
    static const std::array<std::string, 6> kAllowed = {"worker",     "error_code", "error_message",
                                                        "output_dir", "iteration",  "iterations"};
    if (std::find(kAllowed.begin(), kAllowed.end(), field) == kAllowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Transition: field \"", absl::CHexEscape(field),
                                                     "\" cannot be set (allowed: ", absl::StrJoin(kAllowed, ", "),
                                                     ")"));
    }
    int64_t number = 0;
    if ((field == "iteration" || field == "iterations") && !absl::SimpleAtoi(value, &number)) {
      return absl::InvalidArgumentError(absl::StrCat("Transition: field ", field, " must be an integer, got \"",
                                                     absl::CHexEscape(value), "\""));
    }
    args.push_back(field);
    args.push_back(value);
  }
  std::vector<std::string> keys = {impl_->JobKey(id)};
  for (const JobState state : kAllStates) keys.push_back(impl_->StateKey(state));
  STRATA_ASSIGN_OR_RETURN(auto reply, impl_->RunScript(kTransitionScript, keys, args));
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply.get(), "transition"));
  if (tag == "NOT_FOUND") return JobNotFound(id);
  if (tag == "MOVED" && reply->elements >= 4) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", ReplyString(reply->element[1]), " with ",
                                                      ReplyString(reply->element[2]), " \"",
                                                      ReplyString(reply->element[3]), "\", not \"",
                                                      expect.at(ReplyString(reply->element[2])), "\"; cannot move it to ",
                                                      JobStateName(to)));
  }
  if ((tag == "STATE" || tag == "CORRUPT") && reply->elements >= 2 && IsStringReply(reply->element[1])) {
    const std::string current = ReplyString(reply->element[1]);
    if (tag == "CORRUPT") return absl::InternalError(absl::StrCat("job ", id, " has a bad state \"", current, "\""));
    std::vector<std::string> allowed;
    for (const JobState state : from) allowed.push_back(JobStateName(state));
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", current, "; cannot move it to ", JobStateName(to),
                     IsTerminal(ParseJobState(current).value_or(JobState::kQueued))
                         ? " (a finished job never changes state)"
                         : absl::StrCat(" (allowed only from ", absl::StrJoin(allowed, ", "), ")")));
  }
  if (tag != "OK" || reply->elements < 3 || reply->element[2]->type != REDIS_REPLY_INTEGER) {
    return impl_->Unexpected("transition");
  }
  STRATA_ASSIGN_OR_RETURN(JobRecord job, JobFromReply(reply->element[1], "job " + id));
  job.first_start = reply->element[2]->integer == 1;
  return job;
}

absl::Status JobStore::SetProgress(const std::string& id, int64_t iteration) {
  STRATA_RETURN_IF_ERROR(ValidateId("job id", id));
  if (iteration < 0) return absl::InvalidArgumentError(absl::StrCat("iteration must not be negative, got ", iteration));
  STRATA_ASSIGN_OR_RETURN(auto reply,
                          impl_->RunScript(kProgressScript, {impl_->JobKey(id)}, {std::to_string(iteration)}));
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply.get(), "progress"));
  if (tag == "NOT_FOUND") return JobNotFound(id);
  if (tag != "OK") return impl_->Unexpected("progress");
  return absl::OkStatus();
}

absl::Status JobStore::RecordCheckpoint(const std::string& id, int64_t iteration, const std::string& dir) {
  STRATA_RETURN_IF_ERROR(ValidateId("job id", id));
  if (iteration < 0) return absl::InvalidArgumentError(absl::StrCat("iteration must not be negative, got ", iteration));
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint dir is empty");
  auto reply = impl_->RunScript(kCheckpointScript, {impl_->JobKey(id), impl_->JobKey(id) + ":checkpoints"},
                                {std::to_string(iteration), dir});
  if (!reply.ok()) return reply.status();
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply->get(), "checkpoint"));
  if (tag == "NOT_FOUND") return JobNotFound(id);
  if (tag != "OK") return impl_->Unexpected("checkpoint");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> JobStore::ListCheckpoints(const std::string& id) {
  STRATA_RETURN_IF_ERROR(ValidateId("job id", id));
  STRATA_ASSIGN_OR_RETURN(
      auto replies, impl_->Pipeline({{"EXISTS", impl_->JobKey(id)}, {"HGETALL", impl_->JobKey(id) + ":checkpoints"}}));
  const redisReply* exists = replies[0].get();
  if (exists->type != REDIS_REPLY_INTEGER) return impl_->Unexpected("EXISTS");
  if (exists->integer == 0) return JobNotFound(id);
  STRATA_ASSIGN_OR_RETURN(auto hash, HashFromReply(replies[1].get(), "checkpoints of job " + id));
  std::vector<std::pair<int64_t, std::string>> checkpoints;
  for (const auto& [iteration_text, dir] : hash) {
    int64_t iteration = 0;
    if (!absl::SimpleAtoi(iteration_text, &iteration)) {
      return absl::InternalError(absl::StrCat("checkpoints of job ", id, ": bad iteration \"", iteration_text, "\""));
    }
    checkpoints.emplace_back(iteration, dir);
  }
  std::sort(checkpoints.begin(), checkpoints.end());
  return checkpoints;
}

absl::StatusOr<std::string> JobStore::AppendEvent(const std::string& id, const std::string& type,
                                                  const std::string& json) {
  STRATA_RETURN_IF_ERROR(ValidateId("job id", id));
  if (type.empty()) return absl::InvalidArgumentError("event type is empty");
  auto reply = impl_->RunScript(kAppendEventScript, {impl_->JobKey(id), impl_->JobKey(id) + ":events"},
                                {std::to_string(impl_->options_.max_events_per_job), type, json});
  if (!reply.ok()) return reply.status();
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply->get(), "append event"));
  if (tag == "NOT_FOUND") return JobNotFound(id);
  if (tag != "OK" || (*reply)->elements < 2 || !IsStringReply((*reply)->element[1])) {
    return impl_->Unexpected("append event");
  }
  return ReplyString((*reply)->element[1]);
}

absl::StatusOr<std::vector<JobEventRecord>> JobStore::ReadEvents(const std::string& id, const std::string& after_id,
                                                                 int count, int block_ms) {
  STRATA_RETURN_IF_ERROR(ValidateId("job id", id));
  if (!after_id.empty() && !IsStreamId(after_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("after_id \"", absl::CHexEscape(after_id), "\" is not a stream entry id (<ms>-<seq>)"));
  }
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("count must not be negative, got ", count));
  if (block_ms < 0) return absl::InvalidArgumentError(absl::StrCat("block_ms must not be negative, got ", block_ms));
  if (count == 0) count = kDefaultEventCount;
  count = std::min(count, kMaxEventCount);

  // A lease of its own: the blocking XREAD holds this connection for up to
  // block_ms while other calls take other connections.
  STRATA_ASSIGN_OR_RETURN(auto lease, impl_->pool_.Acquire());
  STRATA_ASSIGN_OR_RETURN(auto exists, lease->Command({"EXISTS", impl_->JobKey(id)}));
  if (exists->type != REDIS_REPLY_INTEGER) return impl_->Unexpected("EXISTS");
  if (exists->integer == 0) return JobNotFound(id);

  std::vector<std::string> argv = {"XREAD", "COUNT", std::to_string(count)};
  // XREAD BLOCK 0 would wait forever, so "don't block" leaves BLOCK out.
  if (block_ms > 0) {
    argv.push_back("BLOCK");
    argv.push_back(std::to_string(block_ms));
    // The socket must outwait the server-side block.
    STRATA_RETURN_IF_ERROR(lease->SetTimeout(impl_->pool_.command_timeout_ms() + block_ms));
  }
  argv.push_back("STREAMS");
  argv.push_back(impl_->JobKey(id) + ":events");
  argv.push_back(after_id.empty() ? "0-0" : after_id);
  auto reply = lease->Command(argv);
  if (block_ms > 0 && !lease->broken()) {
    STRATA_RETURN_IF_ERROR(lease->SetTimeout(impl_->pool_.command_timeout_ms()));
  }
  if (!reply.ok()) return reply.status();

  std::vector<JobEventRecord> events;
  const redisReply* r = reply->get();
  if (r->type == REDIS_REPLY_NIL) return events;  // timed out, or nothing new
  // [[key, [[entry_id, [field, value, ...]], ...]]]
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 1) return impl_->Unexpected("XREAD");
  const redisReply* stream = r->element[0];
  if (stream->type != REDIS_REPLY_ARRAY || stream->elements != 2 || stream->element[1]->type != REDIS_REPLY_ARRAY) {
    return impl_->Unexpected("XREAD");
  }
  const redisReply* entries = stream->element[1];
  for (size_t i = 0; i < entries->elements; ++i) {
    const redisReply* entry = entries->element[i];
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements != 2 || !IsStringReply(entry->element[0])) {
      return impl_->Unexpected("XREAD");
    }
    STRATA_ASSIGN_OR_RETURN(auto fields, HashFromReply(entry->element[1], "event of job " + id));
    events.push_back({ReplyString(entry->element[0]), Field(fields, "type"), Field(fields, "json")});
  }
  return events;
}

absl::StatusOr<std::optional<JobEventRecord>> JobStore::LastEvent(const std::string& id) {
  STRATA_RETURN_IF_ERROR(ValidateId("job id", id));
  STRATA_ASSIGN_OR_RETURN(auto exists, impl_->Command({"EXISTS", impl_->JobKey(id)}));
  if (exists->type != REDIS_REPLY_INTEGER) return impl_->Unexpected("EXISTS");
  if (exists->integer == 0) return JobNotFound(id);
  STRATA_ASSIGN_OR_RETURN(auto reply,
                          impl_->Command({"XREVRANGE", impl_->JobKey(id) + ":events", "+", "-", "COUNT", "1"}));
  // [[entry_id, [field, value, ...]]], or [] for no events
  const redisReply* r = reply.get();
  if (r->type != REDIS_REPLY_ARRAY || r->elements > 1) return impl_->Unexpected("XREVRANGE");
  if (r->elements == 0) return std::optional<JobEventRecord>();
  const redisReply* entry = r->element[0];
  if (entry->type != REDIS_REPLY_ARRAY || entry->elements != 2 || !IsStringReply(entry->element[0])) {
    return impl_->Unexpected("XREVRANGE");
  }
  STRATA_ASSIGN_OR_RETURN(auto fields, HashFromReply(entry->element[1], "event of job " + id));
  return std::optional<JobEventRecord>(
      JobEventRecord{ReplyString(entry->element[0]), Field(fields, "type"), Field(fields, "json")});
}

absl::StatusOr<std::vector<JobRecord>> JobStore::ListByState(JobState state) {
  STRATA_ASSIGN_OR_RETURN(auto reply, impl_->Command({"ZRANGE", impl_->StateKey(state), "0", "-1"}));
  std::vector<std::string> ids;
  STRATA_RETURN_IF_ERROR(impl_->ParseIds(reply.get(), false, &ids, nullptr, "ZRANGE"));
  STRATA_ASSIGN_OR_RETURN(auto jobs, impl_->FetchJobs(ids));
  // A job can change state between the ZRANGE and the HGETALL; report only
  // those still in `state`.
  std::erase_if(jobs, [state](const JobRecord& job) { return job.state != state; });
  return jobs;
}

absl::StatusOr<std::map<std::string, int64_t>> JobStore::CountByState() {
  const JobState states[] = {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed,
                             JobState::kCancelled};
  std::vector<std::vector<std::string>> commands;
  for (JobState state : states) commands.push_back({"ZCARD", impl_->StateKey(state)});
  STRATA_ASSIGN_OR_RETURN(auto replies, impl_->Pipeline(commands));
  std::map<std::string, int64_t> counts;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i]->type != REDIS_REPLY_INTEGER) return impl_->Unexpected("ZCARD");
    counts[JobStateName(states[i])] = replies[i]->integer;
  }
  return counts;
}

absl::Status JobStore::RegisterWorker(const WorkerRecord& worker, int ttl_ms) {
  STRATA_RETURN_IF_ERROR(ValidateWorkerId(worker.id));
  STRATA_RETURN_IF_ERROR(ValidateTtl(ttl_ms));
  auto reply = impl_->RunScript(kRegisterWorkerScript, {impl_->WorkerKey(worker.id), impl_->Key("workers")},
                                {worker.id, worker.address, worker.job_id, std::to_string(ttl_ms)});
  if (!reply.ok()) return reply.status();
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply->get(), "register worker"));
  if (tag != "OK") return impl_->Unexpected("register worker");
  return absl::OkStatus();
}

absl::Status JobStore::Heartbeat(const std::string& worker_id, const std::string& job_id, int ttl_ms) {
  STRATA_RETURN_IF_ERROR(ValidateWorkerId(worker_id));
  STRATA_RETURN_IF_ERROR(ValidateTtl(ttl_ms));
  auto reply = impl_->RunScript(kHeartbeatScript, {impl_->WorkerKey(worker_id), impl_->Key("workers")},
                                {worker_id, job_id, std::to_string(ttl_ms)});
  if (!reply.ok()) return reply.status();
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply->get(), "heartbeat"));
  if (tag == "NOT_FOUND") {
    return absl::NotFoundError(absl::StrCat("worker ", worker_id, " is not registered (its registration expired)"));
  }
  if (tag != "OK") return impl_->Unexpected("heartbeat");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WorkerRecord>> JobStore::ListWorkers() {
  STRATA_ASSIGN_OR_RETURN(auto reply,
                          impl_->RunScript(kListWorkersScript, {impl_->Key("workers")}, {impl_->Key("worker:")}));
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply.get(), "list workers"));
  if (tag != "OK" || reply->elements < 2 || reply->element[1]->type != REDIS_REPLY_ARRAY) {
    return impl_->Unexpected("list workers");
  }
  const redisReply* list = reply->element[1];
  std::vector<WorkerRecord> workers;
  for (size_t i = 0; i < list->elements; ++i) {
    STRATA_ASSIGN_OR_RETURN(auto hash, HashFromReply(list->element[i], "worker registration"));
    WorkerRecord worker;
    worker.id = Field(hash, "id");
    worker.address = Field(hash, "address");
    worker.job_id = Field(hash, "job_id");
    if (absl::Status s = ParseInt(hash, "last_heartbeat_unix_ms", "worker " + worker.id,
                                  &worker.last_heartbeat_unix_ms);
        !s.ok()) {
      return s;
    }
    workers.push_back(std::move(worker));
  }
  std::sort(workers.begin(), workers.end(),
            [](const WorkerRecord& a, const WorkerRecord& b) { return a.id < b.id; });
  return workers;
}

absl::Status JobStore::RemoveWorker(const std::string& worker_id) {
  STRATA_RETURN_IF_ERROR(ValidateWorkerId(worker_id));
  STRATA_RETURN_IF_ERROR(impl_->Command({"DEL", impl_->WorkerKey(worker_id)}).status());
  return impl_->Command({"SREM", impl_->Key("workers"), worker_id}).status();
}

absl::Status JobStore::Ping() {
  STRATA_ASSIGN_OR_RETURN(auto reply, impl_->Command({"PING"}));
  if (!IsStringReply(reply.get()) || ReplyString(reply.get()) != "PONG") return impl_->Unexpected("PING");
  return absl::OkStatus();
}

}  // namespace strata::services
