// The Redis job store's Lua scripts: each change to the store is one script,
// so it is atomic with respect to other clients and processes. Internal to
// services/store.
#ifndef STRATA_SERVICES_STORE_REDIS_JOB_SCRIPTS_H_
#define STRATA_SERVICES_STORE_REDIS_JOB_SCRIPTS_H_

#include <string>

namespace strata::services {

enum ScriptId {
  kCreateScript,
  kTransitionScript,
  kProgressScript,
  kCheckpointScript,
  kAppendEventScript,
  kRegisterWorkerScript,
  kHeartbeatScript,
  kListWorkersScript,
  kNumScripts
};

// The script's source, loaded once per connection pool (SCRIPT LOAD) and
// sent again whole when Redis has lost it (NOSCRIPT).
std::string ScriptSource(ScriptId id);

}  // namespace strata::services

#endif  // STRATA_SERVICES_STORE_REDIS_JOB_SCRIPTS_H_
