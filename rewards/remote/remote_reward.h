// Rewards from a remote HTTP server in OpenRLHF's remote reward protocol, so
// that a server written for OpenRLHF (`--remote_rm_url`) works unchanged:
//
//   POST <url>   Content-Type: application/json
//                [Authorization: Bearer <token>]
//   {"query": [prompt + response, ...], "prompts": [...], "labels": [...]}
//   -> 2xx {"rewards": [r0, r1, ...], "scores": [...]?, "extra_logs": {...}?}
//
// The wire format, and what OpenRLHF itself does, are written down at the
// top of reward_protocol.cc; the transfer (batches, retries, containment)
// at the top of remote_reward.cc. No torch.
//
// A reward URL comes from a tenant's job spec and the worker calls it, so
// every call is contained (docs/SECURITY.md, "Reward servers"): only http and
// https, no redirects, no proxy from the environment, and only hosts the
// worker's operator allowed (HostAllowList), connected at the address
// resolved when the client was created.
#ifndef STRATA_REWARDS_REMOTE_REMOTE_REWARD_H_
#define STRATA_REWARDS_REMOTE_REMOTE_REWARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::rewards {

// Which hosts a worker may call (its `--allow-reward-host HOST[:PORT]`,
// repeatable; none by default, so a worker calls no reward server until its
// operator names one). Hosts match by name or by IP literal exactly as the
// URL writes them, case-insensitively: allowing "rm.internal" does not allow
// the URL "http://10.0.0.7/", even where rm.internal resolves to 10.0.0.7.
// An entry without a port allows every port of that host; with one, only
// that port (safer: see docs/SECURITY.md). Immutable; thread-safe.
class HostAllowList {
 public:
  // Entries "example.org", "example.org:8443", "10.0.0.7:9000", "[::1]",
  // "[::1]:8000" (IPv6 in brackets). INVALID_ARGUMENT quoting the malformed
  // entry: an empty one, a scheme or path, a bad host name or IP, a port
  // outside 1..65535, an unbracketed IPv6 address, a zone id, a wildcard.
  static absl::StatusOr<HostAllowList> Parse(const std::vector<std::string>& entries);

  HostAllowList() = default;

  bool empty() const { return entries_.empty(); }
  // True when `host` (a name, an IPv4 literal or a bracketed IPv6 literal, as
  // a URL writes it) on `port` is allowed.
  bool Allows(std::string_view host, int port) const;
  // The entries, normalized, comma-separated ("none" when empty): for
  // messages that tell an operator what the worker allows.
  std::string ToString() const;

 private:
  struct Entry {
    std::string host;  // lower case; IPv6 canonical, in brackets
    int port = 0;      // 0: any port
  };
  std::vector<Entry> entries_;
};

struct RemoteRewardOptions {
  // The server's endpoint, http:// or https:// only, without user
  // credentials (they would appear wherever the URL is named; use
  // bearer_token). E.g. "http://rm.internal:8000/get_reward".
  std::string url;
  // Queries per request (OpenRLHF's serve_rm scores what it is sent, in its
  // own micro-batches).
  int64_t batch_size = 16;
  // Requests in flight at once, 1..64.
  int64_t max_in_flight = 4;
  // Whole-request limit in seconds (connect, send, the server's work, the
  // reply). > 0.
  double timeout_s = 30;
  // Further tries of a request after the first, on connection errors,
  // timeouts and HTTP 5xx / 429 replies, 0..10.
  int64_t retries = 2;
  // Wait before the first retry of a request, in seconds; doubled for each
  // further retry, at most 2 s. 0..2.
  double backoff_s = 0.2;
  // Sent as `Authorization: Bearer <token>`; "" sends none. The caller
  // resolves it (the spec names a secret, not the token). Never logged, never
  // in an error.
  std::string bearer_token;
  // PEM file of the CAs that verify an https server; "" = the system's CAs.
  // The server's certificate is always verified.
  std::string ca_file;

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

struct RemoteScores {
  // One per query, in query order; finite.
  std::vector<double> rewards;
  // Per query, the reply's "scores" entry (a number becomes a list of one);
  // empty when no reply had "scores", and an empty entry for a query whose
  // reply had none. Logged, not trained on.
  std::vector<std::vector<double>> scores;
  // The replies' "extra_logs", per key one list with a value per query
  // (a batch's list of its length is spread over its queries; any other
  // value is repeated for each of them; null where a batch lacked the key).
  // null when no reply had "extra_logs".
  nlohmann::json extra_logs = nullptr;
  // Wall time of the whole call in seconds, retries and waits included.
  double seconds = 0;
  // Requests sent, retries included.
  int64_t requests = 0;
};

// Calls one reward server. Create checks the URL against the allow list and
// resolves its host once; every request goes to those addresses.
class RemoteRewardClient {
 public:
  // INVALID_ARGUMENT from Validate or for a URL curl cannot parse, with user
  // credentials, or of another scheme (ftp://, file://, ...).
  // PERMISSION_DENIED naming the host, its port and the allowed entries when
  // the allow list does not allow the URL's host:port; nothing is resolved
  // or sent. NOT_FOUND when ca_file does not exist. UNAVAILABLE naming the
  // host when it does not resolve.
  static absl::StatusOr<std::unique_ptr<RemoteRewardClient>> Create(RemoteRewardOptions options,
                                                                    const HostAllowList& allowed);
  ~RemoteRewardClient();
  RemoteRewardClient(const RemoteRewardClient&) = delete;
  RemoteRewardClient& operator=(const RemoteRewardClient&) = delete;

  // POSTs the queries (prompt + response, as OpenRLHF's "query"), their
  // prompts and their labels in batches of batch_size, at most max_in_flight
  // requests at once, and returns the rewards in query order. The three
  // lists must have the same length (INVALID_ARGUMENT otherwise); an empty
  // call returns an empty result without a request.
  // Text that is not UTF-8 is sent with U+FFFD in place of the bad bytes.
  //
  // Errors name the URL; the first one ends the call (other requests are
  // abandoned):
  //   UNAVAILABLE          the server stayed unreachable (refused, reset,
  //                        timed out) or kept answering 5xx / 429 through
  //                        every retry; names the last error. A timeout is
  //                        UNAVAILABLE too, not DEADLINE_EXCEEDED: the call
  //                        itself has no deadline, the server did not answer.
  //   PERMISSION_DENIED    a 3xx reply; names its Location, which is never
  //                        contacted.
  //   FAILED_PRECONDITION  the server answered, but wrongly: another 4xx
  //                        (with the status and the body's first 200
  //                        bytes), a reply that is not JSON, not an object,
  //                        without "rewards", with the wrong count, or with a
  //                        reward that is not a finite number (NaN,
  //                        infinity, a string, a bool); a reply over 64 MiB;
  //                        an https server whose certificate fails.
  //   CANCELLED            the process-wide interrupt (base/interrupt.h)
  //                        was raised; checked at least once a second.
  // Thread-compatible: concurrent calls are safe (each has its own
  // transfers); the client must outlive them.
  absl::StatusOr<RemoteScores> Score(const std::vector<std::string>& queries, const std::vector<std::string>& prompts,
                                     const std::vector<std::string>& labels) const;

  // The URL requests go to, as curl normalized it.
  const std::string& url() const { return url_; }
  // The addresses the host resolved to at Create, comma-separated; every
  // connection goes to one of them.
  const std::string& pinned_addresses() const { return addresses_; }

 private:
  struct Pinning;
  RemoteRewardClient(RemoteRewardOptions options, std::string url, std::string addresses,
                     std::unique_ptr<Pinning> pinning);

  RemoteRewardOptions options_;
  std::string url_;
  std::string addresses_;
  std::unique_ptr<Pinning> pinning_;  // curl lists: the pinned addresses, the headers
};

}  // namespace strata::rewards

#endif  // STRATA_REWARDS_REMOTE_REMOTE_REWARD_H_
