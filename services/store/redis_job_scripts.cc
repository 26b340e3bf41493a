#include "services/store/redis_job_scripts.h"

#include "absl/strings/str_cat.h"

namespace strata::services {
namespace {

// Every script returns {tag, ...}: "OK" with its result, or a tag the caller
// turns into a Status. Timestamps come from the Redis server clock so that
// several coordinators agree on ordering.
constexpr char kNowLua[] =
    "local t = redis.call('TIME')\n"
    "local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))\n";

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

}  // namespace

std::string ScriptSource(ScriptId id) {
  switch (id) {
    case kCreateScript:
      return absl::StrCat(kNowLua, kCreateLua);
    case kTransitionScript:
      return absl::StrCat(kNowLua, kTransitionLua);
    case kProgressScript:
      return absl::StrCat(kNowLua, kProgressLua);
    case kCheckpointScript:
      return absl::StrCat(kNowLua, kCheckpointLua);
    case kAppendEventScript:
      return kAppendEventLua;
    case kRegisterWorkerScript:
      return absl::StrCat(kNowLua, kRegisterWorkerLua);
    case kHeartbeatScript:
      return absl::StrCat(kNowLua, kHeartbeatLua);
    case kListWorkersScript:
      return kListWorkersLua;
    case kNumScripts:
      break;
  }
  return "";
}

}  // namespace strata::services
