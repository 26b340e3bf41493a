#include "services/store/redis_job_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "services/store/job_store_checks.h"
#include "services/store/redis_client.h"
#include "services/store/redis_job_scripts.h"

namespace strata::services {
namespace {

using namespace store_checks;  // NOLINT: this file implements their contract

// ListByState fetches job hashes in pipelined batches of this many.
constexpr size_t kFetchBatch = 256;

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

}  // namespace

absl::Status RedisStoreOptions::Validate() const {
  if (auto endpoint = ParseRedisUrl(redis_url); !endpoint.ok()) return endpoint.status();
  if (connect_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisStoreOptions.connect_timeout_ms must be positive, got ", connect_timeout_ms));
  }
  if (command_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisStoreOptions.command_timeout_ms must be positive, got ", command_timeout_ms));
  }
  if (max_idle_connections < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisStoreOptions.max_idle_connections must not be negative, got ", max_idle_connections));
  }
  if (max_events_per_job <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisStoreOptions.max_events_per_job must be positive, got ", max_events_per_job));
  }
  return absl::OkStatus();
}

namespace {

class RedisJobStore final : public JobStore {
 public:
  class Impl;
  explicit RedisJobStore(std::unique_ptr<Impl> impl);
  ~RedisJobStore() override;

  absl::StatusOr<JobRecord> Create(JobRecord job, bool* created) override;
  absl::StatusOr<JobRecord> Get(const std::string& id) override;
  absl::StatusOr<std::pair<std::vector<JobRecord>, std::string>> List(int page_size, const std::string& page_token,
                                                                      std::optional<JobState> state) override;
  absl::StatusOr<JobRecord> Transition(const std::string& id, std::vector<JobState> from, JobState to,
                                       const std::map<std::string, std::string>& fields,
                                       const std::map<std::string, std::string>& expect) override;
  absl::Status SetProgress(const std::string& id, int64_t iteration) override;
  absl::Status RecordCheckpoint(const std::string& id, int64_t iteration, const std::string& dir) override;
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListCheckpoints(const std::string& id) override;
  absl::StatusOr<std::string> AppendEvent(const std::string& id, const std::string& type,
                                          const std::string& json) override;
  absl::StatusOr<std::vector<JobEventRecord>> ReadEvents(const std::string& id, const std::string& after_id, int count,
                                                         int block_ms) override;
  absl::StatusOr<std::optional<JobEventRecord>> LastEvent(const std::string& id) override;
  absl::StatusOr<std::vector<JobRecord>> ListByState(JobState state) override;
  absl::StatusOr<std::map<std::string, int64_t>> CountByState() override;
  absl::Status RegisterWorker(const WorkerRecord& worker, int ttl_ms) override;
  absl::Status Heartbeat(const std::string& worker_id, const std::string& job_id, int ttl_ms) override;
  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() override;
  absl::Status RemoveWorker(const std::string& worker_id) override;
  absl::Status Ping() override;

 private:
  std::unique_ptr<Impl> impl_;
};

class RedisJobStore::Impl {
 public:
  Impl(const RedisStoreOptions& options, RedisEndpoint endpoint)
      : options_(options),
        address_(endpoint.Address()),
        pool_(std::move(endpoint), options.connect_timeout_ms, options.command_timeout_ms,
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

  const RedisStoreOptions options_;
  const std::string address_;
  ConnectionPool pool_;
  std::array<std::string, kNumScripts> shas_;  // set once by LoadScripts, read-only after
};

RedisJobStore::RedisJobStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RedisJobStore::~RedisJobStore() = default;

absl::StatusOr<JobRecord> RedisJobStore::Create(JobRecord job, bool* created) {
  if (created != nullptr) *created = false;
  STRATA_RETURN_IF_ERROR(ValidateRequestId(job.tenant, job.request_id));
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
  for (const std::string& run : job.resumable_run_ids) STRATA_RETURN_IF_ERROR(ValidateJobId("resumable run id", run));
  // Tenants' idempotency keys live apart: one tenant's request id never
  // returns another's job.
  const std::string request_key = impl_->Key("request:" + RequestKey(job.tenant, job.request_id));
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
      return tag == "CONTINUED" ? ContinuedAlready(continued, detail) : NotContinuable(continued, detail);
    }
    if (tag == "EXISTS") {
      if ((*reply)->elements < 2 || !IsStringReply((*reply)->element[1])) return impl_->Unexpected("create");
      const std::string existing = ReplyString((*reply)->element[1]);
      auto existing_job = Get(existing);
      if (!existing_job.ok() && absl::IsNotFound(existing_job.status())) {
        return absl::InternalError(
            absl::StrCat("request_id ", job.request_id, " names job ", existing, ", which no longer exists"));
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

absl::StatusOr<JobRecord> RedisJobStore::Get(const std::string& id) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_ASSIGN_OR_RETURN(auto reply, impl_->Command({"HGETALL", impl_->JobKey(id)}));
  if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 0) return JobNotFound(id);
  return JobFromReply(reply.get(), "job " + id);
}

absl::StatusOr<std::pair<std::vector<JobRecord>, std::string>> RedisJobStore::List(int page_size,
                                                                                   const std::string& page_token,
                                                                                   std::optional<JobState> state) {
  STRATA_ASSIGN_OR_RETURN(page_size, PageSize(page_size));
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

absl::StatusOr<JobRecord> RedisJobStore::Transition(const std::string& id, std::vector<JobState> from, JobState to,
                                                    const std::map<std::string, std::string>& fields,
                                                    const std::map<std::string, std::string>& expect) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_RETURN_IF_ERROR(CheckTransition(from, fields, expect));
  std::vector<std::string> args = {JobStateName(to), std::to_string(from.size())};
  for (const JobState state : from) args.push_back(JobStateName(state));
  args.push_back(std::to_string(expect.size()));
  for (const auto& [field, value] : expect) {
    args.push_back(field);
    args.push_back(value);
  }
  for (const auto& [field, value] : fields) {
    args.push_back(field);
    args.push_back(value);
  }
  std::vector<std::string> keys = {impl_->JobKey(id)};
  for (const JobState state : kAllStates) keys.push_back(impl_->StateKey(state));
  STRATA_ASSIGN_OR_RETURN(auto reply, impl_->RunScript(kTransitionScript, keys, args));
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply.get(), "transition"));
  if (tag == "NOT_FOUND") return JobNotFound(id);
  if ((tag == "STATE" || tag == "CORRUPT" || tag == "MOVED") && reply->elements >= 2 &&
      IsStringReply(reply->element[1])) {
    const std::string text = ReplyString(reply->element[1]);
    auto current = ParseJobState(text);
    if (tag == "CORRUPT" || !current.ok()) {
      return absl::InternalError(absl::StrCat("job ", id, " has a bad state \"", text, "\""));
    }
    if (tag == "STATE") return TransitionRefused(id, *current, from, to);
    if (reply->elements >= 4) {
      const std::string field = ReplyString(reply->element[2]);
      return ClaimMoved(id, *current, field, ReplyString(reply->element[3]), expect.at(field), to);
    }
  }
  if (tag != "OK" || reply->elements < 3 || reply->element[2]->type != REDIS_REPLY_INTEGER) {
    return impl_->Unexpected("transition");
  }
  STRATA_ASSIGN_OR_RETURN(JobRecord job, JobFromReply(reply->element[1], "job " + id));
  job.first_start = reply->element[2]->integer == 1;
  return job;
}

absl::Status RedisJobStore::SetProgress(const std::string& id, int64_t iteration) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_RETURN_IF_ERROR(ValidateIteration(iteration));
  STRATA_ASSIGN_OR_RETURN(auto reply,
                          impl_->RunScript(kProgressScript, {impl_->JobKey(id)}, {std::to_string(iteration)}));
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply.get(), "progress"));
  if (tag == "NOT_FOUND") return JobNotFound(id);
  if (tag != "OK") return impl_->Unexpected("progress");
  return absl::OkStatus();
}

absl::Status RedisJobStore::RecordCheckpoint(const std::string& id, int64_t iteration, const std::string& dir) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_RETURN_IF_ERROR(ValidateIteration(iteration));
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint dir is empty");
  auto reply = impl_->RunScript(kCheckpointScript, {impl_->JobKey(id), impl_->JobKey(id) + ":checkpoints"},
                                {std::to_string(iteration), dir});
  if (!reply.ok()) return reply.status();
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply->get(), "checkpoint"));
  if (tag == "NOT_FOUND") return JobNotFound(id);
  if (tag != "OK") return impl_->Unexpected("checkpoint");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> RedisJobStore::ListCheckpoints(const std::string& id) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_ASSIGN_OR_RETURN(auto replies, impl_->Pipeline({{"EXISTS", impl_->JobKey(id)},
                                                         {"HGETALL", impl_->JobKey(id) + ":checkpoints"}}));
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

absl::StatusOr<std::string> RedisJobStore::AppendEvent(const std::string& id, const std::string& type,
                                                       const std::string& json) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
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

absl::StatusOr<std::vector<JobEventRecord>> RedisJobStore::ReadEvents(const std::string& id,
                                                                      const std::string& after_id, int count,
                                                                      int block_ms) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_ASSIGN_OR_RETURN(count, EventCount(after_id, count, block_ms));

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

absl::StatusOr<std::optional<JobEventRecord>> RedisJobStore::LastEvent(const std::string& id) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
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

absl::StatusOr<std::vector<JobRecord>> RedisJobStore::ListByState(JobState state) {
  STRATA_ASSIGN_OR_RETURN(auto reply, impl_->Command({"ZRANGE", impl_->StateKey(state), "0", "-1"}));
  std::vector<std::string> ids;
  STRATA_RETURN_IF_ERROR(impl_->ParseIds(reply.get(), false, &ids, nullptr, "ZRANGE"));
  STRATA_ASSIGN_OR_RETURN(auto jobs, impl_->FetchJobs(ids));
  // A job can change state between the ZRANGE and the HGETALL; report only
  // those still in `state`.
  std::erase_if(jobs, [state](const JobRecord& job) { return job.state != state; });
  return jobs;
}

absl::StatusOr<std::map<std::string, int64_t>> RedisJobStore::CountByState() {
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

absl::Status RedisJobStore::RegisterWorker(const WorkerRecord& worker, int ttl_ms) {
  STRATA_RETURN_IF_ERROR(ValidateWorkerId(worker.id));
  STRATA_RETURN_IF_ERROR(ValidateTtl(ttl_ms));
  auto reply = impl_->RunScript(kRegisterWorkerScript, {impl_->WorkerKey(worker.id), impl_->Key("workers")},
                                {worker.id, worker.address, worker.job_id, std::to_string(ttl_ms)});
  if (!reply.ok()) return reply.status();
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply->get(), "register worker"));
  if (tag != "OK") return impl_->Unexpected("register worker");
  return absl::OkStatus();
}

absl::Status RedisJobStore::Heartbeat(const std::string& worker_id, const std::string& job_id, int ttl_ms) {
  STRATA_RETURN_IF_ERROR(ValidateWorkerId(worker_id));
  STRATA_RETURN_IF_ERROR(ValidateTtl(ttl_ms));
  auto reply = impl_->RunScript(kHeartbeatScript, {impl_->WorkerKey(worker_id), impl_->Key("workers")},
                                {worker_id, job_id, std::to_string(ttl_ms)});
  if (!reply.ok()) return reply.status();
  STRATA_ASSIGN_OR_RETURN(auto tag, ScriptTag(reply->get(), "heartbeat"));
  if (tag == "NOT_FOUND") {
    return WorkerNotRegistered(worker_id);
  }
  if (tag != "OK") return impl_->Unexpected("heartbeat");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WorkerRecord>> RedisJobStore::ListWorkers() {
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
  std::sort(workers.begin(), workers.end(), [](const WorkerRecord& a, const WorkerRecord& b) { return a.id < b.id; });
  return workers;
}

absl::Status RedisJobStore::RemoveWorker(const std::string& worker_id) {
  STRATA_RETURN_IF_ERROR(ValidateWorkerId(worker_id));
  STRATA_RETURN_IF_ERROR(impl_->Command({"DEL", impl_->WorkerKey(worker_id)}).status());
  return impl_->Command({"SREM", impl_->Key("workers"), worker_id}).status();
}

absl::Status RedisJobStore::Ping() {
  STRATA_ASSIGN_OR_RETURN(auto reply, impl_->Command({"PING"}));
  if (!IsStringReply(reply.get()) || ReplyString(reply.get()) != "PONG") return impl_->Unexpected("PING");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> ConnectRedisJobStore(const RedisStoreOptions& options) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  STRATA_ASSIGN_OR_RETURN(auto endpoint, ParseRedisUrl(options.redis_url));
  if (!options.password.empty()) endpoint.password = options.password;
  auto impl = std::make_unique<RedisJobStore::Impl>(options, std::move(endpoint));
  STRATA_RETURN_IF_ERROR(impl->LoadScripts());
  STRATA_LOG(Info) << "job store connected to redis at " << impl->address_ << " (key prefix \"" << options.key_prefix
                   << "\")";
  return std::unique_ptr<JobStore>(new RedisJobStore(std::move(impl)));
}

}  // namespace strata::services
