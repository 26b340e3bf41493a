// OpenRLHF's remote reward protocol, as strata speaks it.
//
// Request (one per batch of queries):
//   POST <url>
//   Content-Type: application/json
//   Authorization: Bearer <token>          (only when the spec names a token)
//   {"query":   ["<prompt + response>", ...],
//    "prompts": ["<prompt>", ...],
//    "labels":  ["<label>", ...]}           the three lists of equal length
//
// Reply (2xx):
//   {"rewards":    [r0, r1, ...],           required; one finite number per query
//    "scores":     [s0, s1, ...],           optional; numbers or lists of numbers
//    "extra_logs": {"key": [...] or v, ...} optional; for the logs
//    ...}                                   anything else is ignored
//
// What OpenRLHF does (OpenRLHF/OpenRLHF at 3c3be62, 2026-08), which this
// follows so that servers written for it work unchanged:
// - openrlhf/utils/agent.py, SingleTurnAgentExecutor._fetch_rewards_via_http:
//   POSTs json={"query", "prompts", "labels"} (lists; one sample per request
//   there, spread over the endpoints), aiohttp with a 180 s total timeout,
//   raise_for_status, then response.json(); up to 5 tries, 1 s apart. It
//   reads the reply as a dict: .get("rewards"), .get("scores") (falling back
//   to the rewards) and .get("extra_logs") or {}. So the reply is an object:
//   a top-level list is not accepted (dict.get fails on it), and neither is
//   it here. aiohttp follows redirects by default; strata never does.
// - openrlhf/cli/serve_rm.py, the reference server: replies
//   {"rewards": rewards, "scores": rewards, "extra_logs": {"dummy_scores":
//   rewards}}, each a list with one entry per query.
// - The older openrlhf/utils/remote_rm_utils.py (request_api_wrapper) posted
//   {"query": queries} alone, asserted "rewards" in the reply and returned
//   it: servers of that era ignore "prompts" and "labels", which is fine.
// - OpenRLHF builds torch.tensor([reward]) from a one-sample reply, so a
//   bare number works there for a request of one; it does here too.
//
// Failures are FAILED_PRECONDITION: the server answered, but not in the
// protocol. The caller passed nothing wrong (not INVALID_ARGUMENT), and
// asking again will not help (not UNAVAILABLE, which the coordinator treats
// as a lost gang and requeues): the server must be fixed first.
#include "rewards/remote/reward_protocol.h"

#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata::rewards {
namespace {

using json = nlohmann::json;

// Deeper values are not kept; a reply needs depth 3 ({"scores": [[x]]}),
// extra_logs a little more. Bounds the work of whoever walks the result.
constexpr int kMaxDepth = 64;
// Bytes of the peer's reply quoted back in an error.
constexpr size_t kQuoteBytes = 200;
constexpr size_t kValueQuoteBytes = 64;

absl::Status BadReply(const std::string& url, const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat("reward server ", url, ": ", what));
}

std::string Quote(const json& value) {
  return QuoteBytes(value.dump(-1, ' ', false, json::error_handler_t::replace), kValueQuoteBytes);
}

// A list of one entry per query: the field's list of `count`, or a bare
// value where `count` is 1 (see the top of the file).
absl::StatusOr<std::vector<const json*>> PerQuery(const json& field, const char* name, size_t count,
                                                  const std::string& url) {
  std::vector<const json*> entries;
  if (field.is_array()) {
    if (field.size() != count) {
      return BadReply(url, absl::StrCat("\"", name, "\" has ", field.size(), " entries for ", count,
                                        count == 1 ? " query" : " queries"));
    }
    for (const json& entry : field) entries.push_back(&entry);
  } else if (count == 1 && field.is_number()) {
    entries.push_back(&field);
  } else {
    return BadReply(url, absl::StrCat("\"", name, "\" is not a list but ", Quote(field)));
  }
  return entries;
}

// One finite number. bool is not a number (nlohmann agrees: is_number() is
// false for true/false). nlohmann already refuses 1e999 ("number
// overflow"); the check stays for whatever else could yield infinity.
absl::StatusOr<double> FiniteNumber(const json& value, const char* name, size_t index, const std::string& url) {
  if (value.is_number()) {
    const double x = value.get<double>();
    if (std::isfinite(x)) return x;
  }
  return BadReply(url, absl::StrCat("\"", name, "\" of query ", index, " is not a finite number: ", Quote(value)));
}

}  // namespace

std::string QuoteBytes(std::string_view bytes, size_t limit) {
  std::string quoted = absl::CHexEscape(std::string(bytes.substr(0, limit)));
  if (bytes.size() > limit) absl::StrAppend(&quoted, "...");
  return quoted;
}

std::string RewardRequestBody(const std::vector<std::string>& queries, const std::vector<std::string>& prompts,
                              const std::vector<std::string>& labels, size_t begin, size_t end) {
  auto slice = [&](const std::vector<std::string>& list) {
    return json(std::vector<std::string>(list.begin() + begin, list.begin() + end));
  };
  const json body = {{"query", slice(queries)}, {"prompts", slice(prompts)}, {"labels", slice(labels)}};
  // A response cut at max_new_tokens may end inside a UTF-8 character; dump
  // would throw on it.
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<RewardReply> ParseRewardReply(std::string_view body, size_t count, size_t first,
                                             const std::string& url) {
  bool too_deep = false;
  const json::parser_callback_t bound_depth = [&too_deep](int depth, json::parse_event_t, json&) {
    if (depth > kMaxDepth) too_deep = true;
    return depth <= kMaxDepth;
  };
  json reply;
  try {
    reply = json::parse(body, bound_depth);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    const bool python_nan = body.find("NaN") != std::string_view::npos ||
                            body.find("Infinity") != std::string_view::npos;
    return BadReply(url, absl::StrCat("the reply is not JSON",
                                      python_nan ? " (it holds NaN or Infinity, which JSON cannot carry: a reward must "
                                                   "be a finite number)"
                                                 : "",
                                      " (", QuoteBytes(e.what(), kQuoteBytes), "): \"", QuoteBytes(body, kQuoteBytes),
                                      "\""));
  }
  if (too_deep) return BadReply(url, absl::StrCat("the reply is nested deeper than ", kMaxDepth));
  if (!reply.is_object()) {
    return BadReply(url, absl::StrCat("the reply is not a JSON object with \"rewards\": \"",
                                      QuoteBytes(body, kQuoteBytes), "\""));
  }
  RewardReply out;
  const auto rewards = reply.find("rewards");
  if (rewards == reply.end()) {
    return BadReply(url, absl::StrCat("the reply has no \"rewards\": \"", QuoteBytes(body, kQuoteBytes), "\""));
  }
  STRATA_ASSIGN_OR_RETURN(const auto reward_entries, PerQuery(*rewards, "rewards", count, url));
  for (size_t i = 0; i < count; ++i) {
    STRATA_ASSIGN_OR_RETURN(const double r, FiniteNumber(*reward_entries[i], "rewards", first + i, url));
    out.rewards.push_back(r);
  }
  if (const auto scores = reply.find("scores"); scores != reply.end() && !scores->is_null()) {
    STRATA_ASSIGN_OR_RETURN(const auto score_entries, PerQuery(*scores, "scores", count, url));
    for (size_t i = 0; i < count; ++i) {
      const json& entry = *score_entries[i];
      std::vector<double> values;
      if (entry.is_array()) {
        for (const json& v : entry) {
          STRATA_ASSIGN_OR_RETURN(const double x, FiniteNumber(v, "scores", first + i, url));
          values.push_back(x);
        }
      } else {
        STRATA_ASSIGN_OR_RETURN(const double x, FiniteNumber(entry, "scores", first + i, url));
        values.push_back(x);
      }
      out.scores.push_back(std::move(values));
    }
  }
  if (const auto logs = reply.find("extra_logs"); logs != reply.end() && !logs->is_null()) {
    if (!logs->is_object()) return BadReply(url, absl::StrCat("\"extra_logs\" is not an object but ", Quote(*logs)));
    out.extra_logs = *logs;
  }
  return out;
}

RemoteScores MergeRewardReplies(std::vector<RewardReply> replies) {
  RemoteScores merged;
  bool any_scores = false;
  std::set<std::string> keys;
  for (const RewardReply& reply : replies) {
    any_scores = any_scores || !reply.scores.empty();
    if (reply.extra_logs.is_object()) {
      for (const auto& [key, value] : reply.extra_logs.items()) keys.insert(key);
    }
  }
  if (!keys.empty()) {
    merged.extra_logs = json::object();
    for (const std::string& key : keys) merged.extra_logs[key] = json::array();
  }
  for (RewardReply& reply : replies) {
    const size_t n = reply.rewards.size();
    merged.rewards.insert(merged.rewards.end(), reply.rewards.begin(), reply.rewards.end());
    if (any_scores) {
      if (reply.scores.empty()) reply.scores.resize(n);
      for (auto& s : reply.scores) merged.scores.push_back(std::move(s));
    }
    for (const std::string& key : keys) {
      json& list = merged.extra_logs[key];
      const auto found = reply.extra_logs.is_object() ? reply.extra_logs.find(key) : reply.extra_logs.end();
      const json value = found != reply.extra_logs.end() ? *found : json(nullptr);
      if (value.is_array() && value.size() == n) {
        for (const json& v : value) list.push_back(v);
      } else {
        for (size_t i = 0; i < n; ++i) list.push_back(value);
      }
    }
  }
  return merged;
}

}  // namespace strata::rewards
