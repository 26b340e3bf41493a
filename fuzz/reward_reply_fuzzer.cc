// A reward server's reply body, as a worker reads it (OpenRLHF's remote
// reward protocol, rewards/remote/reward_protocol.h): the server is the
// tenant's, so every byte of it is. The body is read for batches of 1 to 3
// queries and for as many as its "rewards" list holds, and what parses is
// merged as a call's batches are. The same bytes also go out as a query,
// prompt and label: the request body must be JSON whatever they hold.
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "rewards/remote/reward_protocol.h"

namespace {

using json = nlohmann::json;
using strata::fuzz::Check;
namespace rewards = strata::rewards;

constexpr char kUrl[] = "http://verifier:8000/score";
// The longest error a reply may cause: a few quotes of at most 200 bytes,
// each escaped to at most four characters a byte, and their context.
constexpr size_t kMaxMessageBytes = 4096;

bool AllFinite(const std::vector<double>& values) {
  for (double v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

bool HasControlByte(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte < 0x20 || byte == 0x7f;
  });
}

// The number of entries of the body's "rewards" list, or 0.
size_t ListedRewards(std::string_view body) {
  // Bounded as the protocol bounds it: deeper values are dropped.
  const json::parser_callback_t shallow = [](int depth, json::parse_event_t, json&) { return depth <= 64; };
  const json reply = json::parse(body, shallow, /*allow_exceptions=*/false);
  if (!reply.is_object()) return 0;
  const auto rewards = reply.find("rewards");
  if (rewards == reply.end() || !rewards->is_array() || rewards->size() > 4096) return 0;
  return rewards->size();
}

void CheckReply(const rewards::RewardReply& reply, size_t count) {
  Check(reply.rewards.size() == count, "one reward per query");
  Check(AllFinite(reply.rewards), "rewards are finite");
  Check(reply.scores.empty() || reply.scores.size() == count, "no scores, or one entry per query");
  for (const auto& entry : reply.scores) Check(AllFinite(entry), "scores are finite");
  Check(reply.extra_logs.is_null() || reply.extra_logs.is_object(), "extra_logs is null or an object");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);

  std::vector<size_t> counts = {1, 2, 3};
  if (const size_t listed = ListedRewards(body); listed > 3) counts.push_back(listed);
  std::vector<rewards::RewardReply> parsed;
  size_t total = 0;
  for (const size_t count : counts) {
    auto reply = rewards::ParseRewardReply(body, count, /*first=*/7, kUrl);
    if (!reply.ok()) {
      Check(reply.status().code() == absl::StatusCode::kFailedPrecondition, "a bad reply is FAILED_PRECONDITION");
      const std::string message(reply.status().message());
      Check(message.find(kUrl) != std::string::npos, "the error names the URL");
      // The peer's bytes are quoted escaped and cut short (remote_reward.cc):
      // a reply must not grow the job's error, nor write into its log line.
      Check(message.size() <= kMaxMessageBytes, "the error quotes a bounded part of the reply");
      Check(!HasControlByte(message), "the error holds no control character");
      continue;
    }
    CheckReply(*reply, count);
    auto again = rewards::ParseRewardReply(body, count, /*first=*/0, kUrl);
    Check(again.ok() && again->rewards == reply->rewards && again->scores == reply->scores &&
              again->extra_logs == reply->extra_logs,
          "the first query's index changes only messages");
    total += count;
    parsed.push_back(*std::move(reply));
  }

  // The batches of one call, merged in query order.
  bool any_scores = false;
  for (const auto& reply : parsed) any_scores = any_scores || !reply.scores.empty();
  const rewards::RemoteScores merged = rewards::MergeRewardReplies(parsed);
  Check(merged.rewards.size() == total, "merged: one reward per query");
  Check(merged.scores.size() == (any_scores ? total : 0), "merged: scores for every query or none");
  if (!merged.extra_logs.is_null()) {
    Check(merged.extra_logs.is_object(), "merged extra_logs is an object");
    for (const auto& [key, list] : merged.extra_logs.items()) {
      Check(list.is_array() && list.size() == total, "merged extra_logs: one value per query");
    }
  }

  // The same bytes as a query, prompt and label: the request is JSON with
  // three lists of one string each (bytes that are not UTF-8 replaced).
  const std::string text(body);
  const json request = json::parse(rewards::RewardRequestBody({text, "q"}, {text, "p"}, {text, "l"}, 0, 1), nullptr,
                                   false);
  Check(request.is_object() && request.size() == 3, "the request is an object of three fields");
  for (const char* key : {"query", "prompts", "labels"}) {
    Check(request.contains(key) && request[key].is_array() && request[key].size() == 1 && request[key][0].is_string(),
          "each request field is a list of one string");
  }
  bool utf8 = true;
  try {
    (void)json(text).dump();
  } catch (const json::type_error&) {
    utf8 = false;
  }
  Check(!utf8 || request["query"][0] == text, "UTF-8 text is sent as it is");
  return 0;
}
