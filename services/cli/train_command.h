// `strata train SPEC.yaml`: runs one job in-process: a gang of
// parallel.workers ranks (threads, Gloo over loopback when more than one).
#ifndef STRATA_SERVICES_CLI_TRAIN_COMMAND_H_
#define STRATA_SERVICES_CLI_TRAIN_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::services {

struct TrainRequest {
  std::string spec_path;
  std::vector<std::string> overrides;  // --set key.path=value
  std::string out_dir;                 // --out: replaces output.dir
  std::string metrics_path;            // --metrics
  bool resume = false;
  bool overwrite = false;  // --overwrite: a fresh run removes earlier checkpoints
  int workers = 0;         // --workers: replaces parallel.workers (0: keep)
  // --collective-timeout-ms: bounds forming the gang and each collective.
  // A rank's phase may run this much longer than another's before the
  // collective that ends it fails (a long scoring pass on a larger shard).
  int collective_timeout_ms = 60000;
  // What remote reward sources may reach: --allow-reward-host HOST[:PORT]
  // and --reward-secret NAME=FILE (repeatable), as a worker's flags.
  std::vector<std::string> allow_reward_hosts;
  std::vector<std::string> reward_secrets;
};

// Returns a one-line summary for stdout; progress goes to stderr.
absl::StatusOr<std::string> RunTrain(const TrainRequest& request);

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_TRAIN_COMMAND_H_
