// `strata reward SPEC.yaml`: scores one response with the spec's reward
// sources, so a user can check a reward before running a job.
#ifndef STRATA_SERVICES_CLI_REWARD_COMMAND_H_
#define STRATA_SERVICES_CLI_REWARD_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::services {

struct RewardRequest {
  std::string spec_path;
  std::vector<std::string> overrides;  // --set key.path=value
  std::string prompt;                  // --prompt: raw text (rendered as a user turn with data.apply_chat_template)
  std::string messages_file;           // --messages: a conversation, rendered with the actor's template
  std::string response;                // --response: the text to score
  std::string label;                   // --label: the reference answer verifiers compare with
  bool json = false;
  std::vector<std::string> allow_reward_hosts;  // as `strata train`
  std::vector<std::string> reward_secrets;
};

// {"sources": {NAME: score, ...}, "reward": weighted sum} with --json, else
// one line per source and the sum. Errors name the flag, the file or the
// source.
absl::StatusOr<std::string> RunReward(const RewardRequest& request);

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_REWARD_COMMAND_H_
