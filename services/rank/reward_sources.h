// The reward of an RL response: the weighted sum of the job's reward
// sources (reward.sources), each of one kind:
//  - model: a reward model with its own tokenizer and chat template. The
//    conversation (prompt messages + the response as the assistant's turn)
//    is rendered with its template and tokenized with its tokenizer; only
//    when it has the actor's tokenizer and template are the actor's ids
//    scored as they are (decode-then-encode is no identity for sampled ids).
//  - verifier: a built-in check of the response against the record's label.
//  - remote: a reward server the user runs, in OpenRLHF's protocol, reached
//    only where the worker's operator allows.
#ifndef STRATA_SERVICES_RANK_REWARD_SOURCES_H_
#define STRATA_SERVICES_RANK_REWARD_SOURCES_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "policies/job/job_spec.h"
#include "policies/tokenizer/tokenizer.h"
#include "policies/train/placed_model.h"
#include "rewards/remote/remote_reward.h"
#include "services/rank/pass_options.h"

namespace strata::services {

// What a worker's operator lets a job's remote sources reach: hosts
// (--allow-reward-host) and bearer tokens by name (--reward-secret NAME=FILE).
struct RewardAccess {
  rewards::HostAllowList hosts;
  std::map<std::string, std::string> secrets;  // name -> token
};

// The worker's flags as RewardAccess: `hosts` (HOST[:PORT]) and `secrets`
// (NAME=FILE; a file only its owner may read, its content trimmed is the
// token). Errors name the flag and the file.
absl::StatusOr<RewardAccess> LoadRewardAccess(const std::vector<std::string>& hosts,
                                              const std::vector<std::string>& secrets);

// One response as the sources read it.
struct ScoredResponse {
  const std::vector<int32_t>* prompt_ids = nullptr;    // the actor's
  const std::vector<int32_t>* response_ids = nullptr;  // the actor's, its stop id included
  std::string prompt_text;                             // as the policy saw it (rendered)
  const nlohmann::ordered_json* messages = nullptr;    // the prompt's conversation; null for raw text
  std::string response_text;                           // decoded, without the stop id
  std::string query_text;  // prompt_text + the response with its special tokens (OpenRLHF's "query")
  std::string label;
};

struct SourceScores {
  std::vector<float> total;                              // the weighted sum per response
  std::map<std::string, std::vector<double>> by_source;  // each source's scores
  std::map<std::string, double> seconds;                 // time spent in each source
};

// Places a reward model (RankMemory::Place under `key`).
using PlaceRewardModel = std::function<absl::StatusOr<std::unique_ptr<policies::PlacedModel>>(
    const std::string& key, const policies::ModelSpec& model)>;

// Not thread-safe: the rank's work thread drives it.
class RewardSources {
 public:
  // Builds `sources` (the spec's reward.sources, or eval.rule's one rule).
  // `actor_tokenizer_path` says which tokenizer and template the actor's ids
  // are in. Errors name the source: an unknown check, a bad pattern, a host
  // the operator does not allow (PERMISSION_DENIED), a token_secret the
  // worker does not hold, a reward model that does not load.
  static absl::StatusOr<std::unique_ptr<RewardSources>> Create(const std::vector<policies::RewardSourceSpec>& sources,
                                                               const policies::JobSpec& spec,
                                                               const std::string& actor_tokenizer_path,
                                                               const RewardAccess& access,
                                                               const PlaceRewardModel& place, PassOptions passes);
  ~RewardSources();

  // Every source's scores of `responses` and their weighted sum. A remote
  // server's failure is its error (naming the URL); UNAVAILABLE when it
  // stays down past its retries.
  absl::StatusOr<SourceScores> Score(const std::vector<ScoredResponse>& responses);

  const std::vector<policies::RewardSourceSpec>& specs() const { return specs_; }

  class Source;

 private:
  RewardSources(std::vector<policies::RewardSourceSpec> specs, std::vector<std::unique_ptr<Source>> sources);

  std::vector<policies::RewardSourceSpec> specs_;
  std::vector<std::unique_ptr<Source>> sources_;
};

// The text views of a response the sources read, from its ids.
ScoredResponse ViewOf(const policies::Tokenizer& tokenizer, const std::vector<int64_t>& stop_ids,
                      const std::vector<int32_t>& prompt_ids, const std::vector<int32_t>& response_ids,
                      std::string prompt_text, const nlohmann::ordered_json* messages, std::string label);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_REWARD_SOURCES_H_
