// The wire format of OpenRLHF's remote reward protocol, as pure functions
// (no I/O): one request body, one reply read, the replies of a call's
// batches merged. The format and what OpenRLHF does are written at the top
// of reward_protocol.cc. Private to rewards/remote (and its tests).
#ifndef STRATA_REWARDS_REMOTE_REWARD_PROTOCOL_H_
#define STRATA_REWARDS_REMOTE_REWARD_PROTOCOL_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "rewards/remote/remote_reward.h"

namespace strata::rewards {

// What one reply says about its batch's queries.
struct RewardReply {
  std::vector<double> rewards;              // one per query, finite
  std::vector<std::vector<double>> scores;  // one per query; empty when the reply had none
  nlohmann::json extra_logs = nullptr;      // the reply's object, or null
};

// The body of the request for queries [begin, end): {"query": [...],
// "prompts": [...], "labels": [...]}. Bytes that are not UTF-8 become
// U+FFFD (a response cut inside a character is still sent).
std::string RewardRequestBody(const std::vector<std::string>& queries, const std::vector<std::string>& prompts,
                              const std::vector<std::string>& labels, size_t begin, size_t end);

// Reads a 2xx reply's body for a batch of `count` queries, the first of
// which is query `first` of the call (errors name queries by their index in
// the call). FAILED_PRECONDITION naming `url` for: not JSON (NaN and
// Infinity, which Python's json.dumps writes, are not JSON; the message says
// so), nested deeper than 64, not an object, no "rewards", a count other than
// `count`, an entry that is not a finite number; the same for a present
// "scores" (entries a number or a list of numbers) and "extra_logs" (an
// object). Unknown fields are ignored. A bare number stands for a list of
// one where `count` is 1.
absl::StatusOr<RewardReply> ParseRewardReply(std::string_view body, size_t count, size_t first, const std::string& url);

// The call's result from its batches' replies, in query order (seconds and
// requests left 0).
RemoteScores MergeRewardReplies(std::vector<RewardReply> replies);

// A peer's bytes for a message: the first `limit` bytes, C-escaped.
std::string QuoteBytes(std::string_view bytes, size_t limit);

}  // namespace strata::rewards

#endif  // STRATA_REWARDS_REMOTE_REWARD_PROTOCOL_H_
