// The transfer side of remote rewards: libcurl (easy handles under one multi
// handle per call), retries, and the containment of a URL that a tenant's
// spec chose. The wire format is in reward_protocol.cc.
//
// Containment. A worker sits inside the cluster's network; a URL from a job
// spec would otherwise let any tenant make the worker send requests anywhere
// it can reach (server-side request forgery: metadata services, Redis, the
// coordinator, other tenants' servers) and read part of the answer back in
// an error. So:
// - The host must be on the worker's allow list (the operator's
//   --allow-reward-host), checked by name or IP literal before anything is
//   resolved or sent. The host is the one curl's own URL parser finds, the
//   parser that then connects: no second parser to disagree about
//   "http://allowed@evil/" or "http://2130706433/".
// - The name is resolved once, in Create, and curl is handed those addresses
//   (CURLOPT_RESOLVE), so DNS cannot answer differently between the check and
//   a connection (DNS rebinding) and every retry goes to the same place.
// - http and https only (CURLOPT_PROTOCOLS_STR, REDIR_PROTOCOLS_STR): no
//   file://, gopher://, dict:// ... even if a URL slipped past Create.
// - No redirects: a 3xx is an error naming its Location, which is never
//   contacted; following it would reach a host nobody checked.
// - No proxy from the environment (CURLOPT_PROXY "" and CURLOPT_NOPROXY "*"):
//   a worker's http_proxy would otherwise carry the request elsewhere, and
//   the proxy, not the pinned address, would pick the destination.
// - Nothing else that moves a connection is enabled: no alt-svc, HSTS,
//   netrc, cookies or CONNECT_TO (libcurl's defaults, left off).
// - The bearer token goes in a header built once; it is never logged or put
//   in an error, and a token with CR or LF (header injection) is refused.
// - Replies are bounded (kMaxReplyBytes), and a peer's bytes quoted back in
//   an error are escaped and cut to 200.
#include "rewards/remote/remote_reward.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <deque>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/interrupt.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "rewards/remote/reward_protocol.h"

namespace strata::rewards {
namespace {

using Clock = std::chrono::steady_clock;

// A reply larger than this is refused: rewards for a batch take a few KiB;
// the bound only keeps a hostile or broken server from filling memory.
constexpr size_t kMaxReplyBytes = size_t{64} << 20;
// The reply body's bytes quoted in an HTTP error.
constexpr size_t kBodyQuoteBytes = 200;
// The longest wait between tries, whatever backoff_s and the try count say.
constexpr double kMaxBackoffS = 2.0;

struct CurlEasyDeleter {
  void operator()(CURL* easy) const { curl_easy_cleanup(easy); }
};
struct CurlMultiDeleter {
  void operator()(CURLM* multi) const { curl_multi_cleanup(multi); }
};
struct CurlSlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
struct CurlUrlDeleter {
  void operator()(CURLU* url) const { curl_url_cleanup(url); }
};
struct CurlStringDeleter {
  void operator()(char* s) const { curl_free(s); }
};
struct AddrinfoDeleter {
  void operator()(addrinfo* list) const { freeaddrinfo(list); }
};
using CurlEasy = std::unique_ptr<CURL, CurlEasyDeleter>;
using CurlMulti = std::unique_ptr<CURLM, CurlMultiDeleter>;
using CurlSlist = std::unique_ptr<curl_slist, CurlSlistDeleter>;

// libcurl's global state must be set up once before any handle, and before
// threads race to do it (curl_global_init is not thread-safe before 7.84).
absl::Status InitCurlOnce() {
  static std::once_flag once;
  static CURLcode result = CURLE_OK;
  std::call_once(once, [] { result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (result != CURLE_OK) {
    return absl::InternalError(absl::StrCat("curl_global_init: ", curl_easy_strerror(result)));
  }
  return absl::OkStatus();
}

// True for a host name of letters, digits, '-' and '_' in dot-separated
// labels of 1..63, 253 at most, whose last label is not all digits (URL
// parsers read "10.1" or "2130706433" as IPv4 numbers).
bool IsHostName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  size_t start = 0;
  bool last_all_digits = false;
  while (start <= name.size()) {
    const size_t dot = std::min(name.find('.', start), name.size());
    const std::string_view label(name.data() + start, dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    last_all_digits = true;
    for (const char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
      if (!std::isdigit(static_cast<unsigned char>(c))) last_all_digits = false;
    }
    start = dot + 1;
  }
  return !last_all_digits;
}

// The host as the allow list compares it: names in lower case without a
// trailing dot, IPv4 dotted quads as they are, IPv6 canonical in brackets.
// INVALID_ARGUMENT for anything else (the caller words the message).
absl::StatusOr<std::string> NormalizeHost(std::string host) {
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return absl::InvalidArgumentError("an unclosed '['");
    const std::string inner = host.substr(1, host.size() - 2);
    if (inner.find('%') != std::string::npos) return absl::InvalidArgumentError("an IPv6 zone id");
    in6_addr addr{};
    if (inet_pton(AF_INET6, inner.c_str(), &addr) != 1) return absl::InvalidArgumentError("not an IPv6 address");
    char text[INET6_ADDRSTRLEN] = {};
    inet_ntop(AF_INET6, &addr, text, sizeof(text));
    return absl::StrCat("[", text, "]");
  }
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return host;
  if (host.find(':') != std::string::npos) return absl::InvalidArgumentError("an IPv6 address must be in brackets");
  if (!host.empty() && host.back() == '.') host.pop_back();
  absl::AsciiStrToLower(&host);
  if (!IsHostName(host)) return absl::InvalidArgumentError("not a host name or IP address");
  return host;
}

bool IsIpLiteral(const std::string& normalized_host) {
  in_addr v4{};
  return normalized_host.front() == '[' || inet_pton(AF_INET, normalized_host.c_str(), &v4) == 1;
}

// One part of a parsed URL; "" when absent.
std::string UrlPart(CURLU* url, CURLUPart part, unsigned flags = 0) {
  char* raw = nullptr;
  if (curl_url_get(url, part, &raw, flags) != CURLUE_OK || raw == nullptr) return "";
  std::unique_ptr<char, CurlStringDeleter> owned(raw);
  return std::string(raw);
}

// The addresses `host` resolves to, as curl's CURLOPT_RESOLVE wants them
// (IPv6 in brackets), in getaddrinfo's order, without repeats.
absl::StatusOr<std::vector<std::string>> Resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  // No AI_ADDRCONFIG: it drops loopback answers on a machine whose only
  // interfaces are loopback.
  addrinfo* raw = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &raw);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("reward host ", host, " does not resolve: ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, AddrinfoDeleter> list(raw);
  std::vector<std::string> addresses;
  for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    std::string address;
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof(text));
      address = text;
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr, text, sizeof(text));
      address = absl::StrCat("[", text, "]");
    } else {
      continue;
    }
    if (std::find(addresses.begin(), addresses.end(), address) == addresses.end()) addresses.push_back(address);
  }
  if (addresses.empty()) return absl::UnavailableError(absl::StrCat("reward host ", host, " has no IP address"));
  return addresses;
}

// What one finished request means for its batch.
struct Attempt {
  enum Kind { kReply, kRetry, kFail } kind = kFail;
  RewardReply reply;    // kReply
  std::string error;    // kRetry: what went wrong, for the log and the last error
  absl::Status status;  // kFail
};

// Curl errors worth another try: the server may be starting, restarting or
// overloaded. Anything else (a certificate that fails, a refused option)
// will fail again the same way.
bool IsTransient(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_AGAIN:
      return true;
    default:
      return false;
  }
}

// One request in flight: its handle, the batch it carries, what came back.
struct Transfer {
  size_t batch = 0;
  CurlEasy easy;
  std::string body;  // must outlive the transfer (CURLOPT_POSTFIELDS does not copy)
  std::string reply;
  bool reply_too_large = false;
  char error[CURL_ERROR_SIZE] = {};
};

size_t AppendReply(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  if (transfer->reply.size() + bytes > kMaxReplyBytes) {
    transfer->reply_too_large = true;
    return 0;  // curl stops with CURLE_WRITE_ERROR
  }
  transfer->reply.append(data, bytes);
  return bytes;
}

// One call's multi handle and its transfers; removes every handle from the
// multi before either is freed, as libcurl requires, on every return path.
class TransferSet {
 public:
  TransferSet() : multi_(curl_multi_init()) {}
  ~TransferSet() {
    for (auto& t : transfers_) curl_multi_remove_handle(multi_.get(), t->easy.get());
  }
  TransferSet(const TransferSet&) = delete;
  TransferSet& operator=(const TransferSet&) = delete;

  CURLM* multi() const { return multi_.get(); }
  size_t size() const { return transfers_.size(); }
  absl::Status Add(std::unique_ptr<Transfer> transfer) {
    const CURLMcode rc = curl_multi_add_handle(multi_.get(), transfer->easy.get());
    if (rc != CURLM_OK) return absl::InternalError(absl::StrCat("curl_multi_add_handle: ", curl_multi_strerror(rc)));
    transfers_.push_back(std::move(transfer));
    return absl::OkStatus();
  }
  // Takes the finished transfer of `easy` out of the set.
  std::unique_ptr<Transfer> Remove(CURL* easy) {
    for (auto it = transfers_.begin(); it != transfers_.end(); ++it) {
      if ((*it)->easy.get() != easy) continue;
      curl_multi_remove_handle(multi_.get(), easy);
      std::unique_ptr<Transfer> t = std::move(*it);
      transfers_.erase(it);
      return t;
    }
    return nullptr;
  }

 private:
  CurlMulti multi_;  // declared first: freed after the transfers
  std::vector<std::unique_ptr<Transfer>> transfers_;
};

}  // namespace

// The curl lists every request of a client shares: the pinned addresses
// (CURLOPT_RESOLVE) and the headers (with the token).
struct RemoteRewardClient::Pinning {
  CurlSlist resolve;
  CurlSlist headers;
};

absl::StatusOr<HostAllowList> HostAllowList::Parse(const std::vector<std::string>& entries) {
  HostAllowList list;
  for (const std::string& entry : entries) {
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("--allow-reward-host \"", QuoteBytes(entry, 64), "\": ", why,
                                                     " (write HOST or HOST:PORT, IPv6 as [ADDR] or [ADDR]:PORT)"));
    };
    if (entry.empty()) return bad("empty");
    if (entry.find('/') != std::string::npos) return bad("a scheme or path");
    if (entry.find('*') != std::string::npos) return bad("wildcards are not supported; name each host");
    std::string host = entry;
    std::string port_text;
    if (entry.front() == '[') {
      const size_t close = entry.find(']');
      if (close == std::string::npos) return bad("an unclosed '['");
      host = entry.substr(0, close + 1);
      const std::string rest = entry.substr(close + 1);
      if (!rest.empty()) {
        if (rest.front() != ':') return bad("text after ']' that is not :PORT");
        port_text = rest.substr(1);
        if (port_text.empty()) return bad("an empty port");
      }
    } else if (const size_t colon = entry.find(':'); colon != std::string::npos) {
      if (entry.find(':', colon + 1) != std::string::npos) return bad("an IPv6 address must be in brackets");
      host = entry.substr(0, colon);
      port_text = entry.substr(colon + 1);
      if (port_text.empty()) return bad("an empty port");
    }
    Entry e;
    if (!port_text.empty()) {
      const bool digits = std::all_of(port_text.begin(), port_text.end(),
                                      [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
      if (!digits || port_text.size() > 5 || !absl::SimpleAtoi(port_text, &e.port) || e.port < 1 || e.port > 65535) {
        return bad("the port is not a number in 1..65535");
      }
    }
    auto normalized = NormalizeHost(host);
    if (!normalized.ok()) return bad(std::string(normalized.status().message()));
    e.host = *std::move(normalized);
    list.entries_.push_back(std::move(e));
  }
  return list;
}

bool HostAllowList::Allows(std::string_view host, int port) const {
  auto normalized = NormalizeHost(std::string(host));
  if (!normalized.ok()) return false;
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const Entry& e) { return e.host == *normalized && (e.port == 0 || e.port == port); });
}

std::string HostAllowList::ToString() const {
  if (entries_.empty()) return "none";
  return absl::StrJoin(entries_, ", ", [](std::string* out, const Entry& e) {
    absl::StrAppend(out, e.host, e.port == 0 ? "" : absl::StrCat(":", e.port));
  });
}

absl::Status RemoteRewardOptions::Validate() const {
  if (url.empty()) return absl::InvalidArgumentError("url is empty");
  if (batch_size < 1) return absl::InvalidArgumentError(absl::StrCat("batch_size must be >= 1, got ", batch_size));
  if (max_in_flight < 1 || max_in_flight > 64) {
    return absl::InvalidArgumentError(absl::StrCat("max_in_flight must be in 1..64, got ", max_in_flight));
  }
  if (!std::isfinite(timeout_s) || timeout_s <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_s must be > 0, got ", timeout_s));
  }
  if (retries < 0 || retries > 10)
    return absl::InvalidArgumentError(absl::StrCat("retries must be in 0..10, got ", retries));
  if (!std::isfinite(backoff_s) || backoff_s < 0 || backoff_s > kMaxBackoffS) {
    return absl::InvalidArgumentError(absl::StrCat("backoff_s must be in 0..", kMaxBackoffS, ", got ", backoff_s));
  }
  // The token is a header value: a line break would let it add headers. Its
  // value is never quoted.
  for (const char c : bearer_token) {
    if (c == '\r' || c == '\n' || c == '\0') {
      return absl::InvalidArgumentError("bearer_token holds a line break or NUL");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RemoteRewardClient>> RemoteRewardClient::Create(RemoteRewardOptions options,
                                                                               const HostAllowList& allowed) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  STRATA_RETURN_IF_ERROR(InitCurlOnce());
  const std::string quoted_url = QuoteBytes(options.url, 256);
  std::unique_ptr<CURLU, CurlUrlDeleter> parsed(curl_url());
  if (parsed == nullptr) return absl::ResourceExhaustedError("curl_url: out of memory");
  if (const CURLUcode rc = curl_url_set(parsed.get(), CURLUPART_URL, options.url.c_str(), 0); rc != CURLUE_OK) {
    return absl::InvalidArgumentError(absl::StrCat("url \"", quoted_url, "\" is not a URL: ", curl_url_strerror(rc)));
  }
  const std::string scheme = absl::AsciiStrToLower(UrlPart(parsed.get(), CURLUPART_SCHEME));
  if (scheme != "http" && scheme != "https") {
    return absl::InvalidArgumentError(
        absl::StrCat("url \"", quoted_url, "\": scheme \"", scheme, "\" is not allowed; use http:// or https://"));
  }
  if (!UrlPart(parsed.get(), CURLUPART_USER).empty() || !UrlPart(parsed.get(), CURLUPART_PASSWORD).empty()) {
    return absl::InvalidArgumentError("url carries user credentials; put a token in bearer_token instead");
  }
  if (!UrlPart(parsed.get(), CURLUPART_ZONEID).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("url \"", quoted_url, "\" names an IPv6 zone id"));
  }
  const std::string host = UrlPart(parsed.get(), CURLUPART_HOST);
  int port = 0;
  if (!absl::SimpleAtoi(UrlPart(parsed.get(), CURLUPART_PORT, CURLU_DEFAULT_PORT), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("url \"", quoted_url, "\" has no valid port"));
  }
  const std::string url = UrlPart(parsed.get(), CURLUPART_URL);
  auto normalized = NormalizeHost(host);
  if (!normalized.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("url \"", quoted_url, "\": host \"", QuoteBytes(host, 64), "\" is ",
                                                   normalized.status().message()));
  }
  // Before any lookup: a refused host sees no DNS query either.
  if (!allowed.Allows(host, port)) {
    return absl::PermissionDeniedError(absl::StrCat("reward host ", *normalized, ":", port, " (url ", url,
                                                    ") is not allowed on this worker; it allows: ", allowed.ToString(),
                                                    " (--allow-reward-host)"));
  }
  if (!options.ca_file.empty() && !IsRegularFile(options.ca_file)) {
    return absl::NotFoundError(absl::StrCat("ca_file ", options.ca_file, " is not a file"));
  }

  auto pinning = std::make_unique<Pinning>();
  std::string addresses;
  if (IsIpLiteral(*normalized)) {
    addresses = *normalized;  // curl connects to a literal without resolving it
  } else {
    STRATA_ASSIGN_OR_RETURN(const std::vector<std::string> resolved, Resolve(host));
    addresses = absl::StrJoin(resolved, ",");
    // "HOST:PORT:ADDR[,ADDR...]": curl's DNS cache answers HOST with these
    // for the handle's life; it never asks the resolver.
    const std::string entry = absl::StrCat(host, ":", port, ":", addresses);
    pinning->resolve.reset(curl_slist_append(nullptr, entry.c_str()));
    if (pinning->resolve == nullptr) return absl::ResourceExhaustedError("curl_slist_append: out of memory");
  }
  std::vector<std::string> headers = {"Content-Type: application/json", "Accept: application/json",
                                      // No "Expect: 100-continue" wait on large bodies (http.server and
                                      // others do not answer it; curl would stall a second per request).
                                      "Expect:"};
  if (!options.bearer_token.empty()) headers.push_back(absl::StrCat("Authorization: Bearer ", options.bearer_token));
  for (const std::string& h : headers) {
    curl_slist* grown = curl_slist_append(pinning->headers.get(), h.c_str());
    if (grown == nullptr) return absl::ResourceExhaustedError("curl_slist_append: out of memory");
    pinning->headers.release();
    pinning->headers.reset(grown);
  }
  STRATA_LOG(Info) << "reward server " << url << " pinned to " << addresses;
  return std::unique_ptr<RemoteRewardClient>(
      new RemoteRewardClient(std::move(options), url, std::move(addresses), std::move(pinning)));
}

RemoteRewardClient::RemoteRewardClient(RemoteRewardOptions options, std::string url, std::string addresses,
                                       std::unique_ptr<Pinning> pinning)
    : options_(std::move(options)),
      url_(std::move(url)),
      addresses_(std::move(addresses)),
      pinning_(std::move(pinning)) {}

RemoteRewardClient::~RemoteRewardClient() = default;

namespace {

// Every option of one request. Any option curl refuses fails the request
// rather than send it with less containment than intended.
absl::Status SetUpRequest(Transfer& t, const std::string& url, const RemoteRewardOptions& options, curl_slist* resolve,
                          curl_slist* headers) {
  CURL* easy = t.easy.get();
  CURLcode rc = CURLE_OK;
  const char* failed = nullptr;
  auto set = [&](const char* name, auto option, auto value) {
    if (rc != CURLE_OK) return;
    rc = curl_easy_setopt(easy, option, value);
    if (rc != CURLE_OK) failed = name;
  };
  set("URL", CURLOPT_URL, url.c_str());
#if LIBCURL_VERSION_NUM >= 0x075500  // 7.85: the string forms
  set("PROTOCOLS_STR", CURLOPT_PROTOCOLS_STR, "http,https");
  set("REDIR_PROTOCOLS_STR", CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
  set("PROTOCOLS", CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
  set("REDIR_PROTOCOLS", CURLOPT_REDIR_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  set("FOLLOWLOCATION", CURLOPT_FOLLOWLOCATION, 0L);
  set("MAXREDIRS", CURLOPT_MAXREDIRS, 0L);
  set("PROXY", CURLOPT_PROXY, "");
  set("NOPROXY", CURLOPT_NOPROXY, "*");
  if (resolve != nullptr) set("RESOLVE", CURLOPT_RESOLVE, resolve);
  set("HTTPHEADER", CURLOPT_HTTPHEADER, headers);
  set("POST", CURLOPT_POST, 1L);
  set("POSTFIELDS", CURLOPT_POSTFIELDS, t.body.data());
  set("POSTFIELDSIZE_LARGE", CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t.body.size()));
  set("TIMEOUT_MS", CURLOPT_TIMEOUT_MS, static_cast<long>(std::ceil(options.timeout_s * 1000)));
  // Timeouts without SIGALRM: several threads may call at once.
  set("NOSIGNAL", CURLOPT_NOSIGNAL, 1L);
  set("WRITEFUNCTION", CURLOPT_WRITEFUNCTION, &AppendReply);
  set("WRITEDATA", CURLOPT_WRITEDATA, static_cast<void*>(&t));
  set("ERRORBUFFER", CURLOPT_ERRORBUFFER, t.error);
  set("USERAGENT", CURLOPT_USERAGENT, "strata-reward-client");
  if (!options.ca_file.empty()) set("CAINFO", CURLOPT_CAINFO, options.ca_file.c_str());
  if (rc != CURLE_OK) {
    return absl::InternalError(absl::StrCat("curl refused CURLOPT_", failed, ": ", curl_easy_strerror(rc)));
  }
  return absl::OkStatus();
}

// What a finished request means: a reply to merge, a reason to try again, or
// the call's error.
Attempt Judge(Transfer& t, CURLcode result, size_t first, size_t count, const std::string& url) {
  Attempt a;
  auto fail = [&](absl::Status status) {
    a.kind = Attempt::kFail;
    a.status = std::move(status);
    return a;
  };
  if (result != CURLE_OK) {
    if (t.reply_too_large) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("reward server ", url, ": the reply exceeds ", kMaxReplyBytes >> 20, " MiB")));
    }
    const std::string what = t.error[0] != '\0' ? t.error : curl_easy_strerror(result);
    if (IsTransient(result)) {
      a.kind = Attempt::kRetry;
      a.error = what;
      return a;
    }
    return fail(absl::FailedPreconditionError(absl::StrCat("reward server ", url, ": ", what)));
  }
  long status = 0;
  curl_easy_getinfo(t.easy.get(), CURLINFO_RESPONSE_CODE, &status);
  if (status >= 200 && status < 300) {
    auto reply = ParseRewardReply(t.reply, count, first, url);
    if (!reply.ok()) return fail(reply.status());
    a.kind = Attempt::kReply;
    a.reply = *std::move(reply);
    return a;
  }
  if (status >= 300 && status < 400) {
    char* location = nullptr;
    curl_easy_getinfo(t.easy.get(), CURLINFO_REDIRECT_URL, &location);
    return fail(absl::PermissionDeniedError(absl::StrCat(
        "reward server ", url, " answered HTTP ", status, " redirecting to ",
        location != nullptr ? absl::StrCat("\"", QuoteBytes(location, 256), "\"") : std::string("(no Location)"),
        "; redirects are not followed (that address was not contacted): give the final URL")));
  }
  const std::string http = absl::StrCat("HTTP ", status, ": \"", QuoteBytes(t.reply, kBodyQuoteBytes), "\"");
  if (status == 429 || status >= 500) {
    a.kind = Attempt::kRetry;
    a.error = http;
    return a;
  }
  return fail(absl::FailedPreconditionError(absl::StrCat(
      "reward server ", url, " answered ", http, status == 401 || status == 403 ? " (check its bearer token)" : "")));
}

// The wait before try `tries + 1` of a request (tries >= 1 made).
Clock::duration Backoff(double backoff_s, int64_t tries) {
  const double seconds = std::min(kMaxBackoffS, backoff_s * std::pow(2.0, static_cast<double>(tries - 1)));
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

absl::StatusOr<RemoteScores> RemoteRewardClient::Score(const std::vector<std::string>& queries,
                                                       const std::vector<std::string>& prompts,
                                                       const std::vector<std::string>& labels) const {
  const auto start = Clock::now();
  if (prompts.size() != queries.size() || labels.size() != queries.size()) {
    return absl::InvalidArgumentError(absl::StrCat("remote reward: ", queries.size(), " queries, ", prompts.size(),
                                                   " prompts and ", labels.size(), " labels; they must match"));
  }
  RemoteScores scores;
  if (queries.empty()) return scores;

  struct Batch {
    size_t begin = 0, end = 0;
    int64_t tries = 0;
    Clock::time_point next_try;
  };
  std::vector<Batch> batches;
  const size_t batch_size = static_cast<size_t>(options_.batch_size);
  for (size_t begin = 0; begin < queries.size(); begin += batch_size) {
    Batch batch;
    batch.begin = begin;
    batch.end = std::min(queries.size(), begin + batch_size);
    batches.push_back(batch);
  }
  std::vector<RewardReply> replies(batches.size());
  std::deque<size_t> ready;  // batches to send now, in order
  for (size_t b = 0; b < batches.size(); ++b) ready.push_back(b);
  std::vector<size_t> waiting;  // batches between tries
  size_t answered = 0;
  TransferSet transfers;
  if (transfers.multi() == nullptr) return absl::ResourceExhaustedError("curl_multi_init: out of memory");

  while (answered < batches.size()) {
    // A cancelled job stops waiting on its reward server within a second
    // (the poll below wakes at least that often).
    STRATA_RETURN_IF_ERROR(CheckInterrupt("remote reward"));
    auto now = Clock::now();
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (batches[*it].next_try <= now) {
        ready.push_back(*it);
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
    while (!ready.empty() && transfers.size() < static_cast<size_t>(options_.max_in_flight)) {
      const size_t b = ready.front();
      ready.pop_front();
      auto t = std::make_unique<Transfer>();
      t->batch = b;
      t->easy.reset(curl_easy_init());
      if (t->easy == nullptr) return absl::ResourceExhaustedError("curl_easy_init: out of memory");
      // Built per try, not kept for all batches: the call holds at most
      // max_in_flight bodies.
      t->body = RewardRequestBody(queries, prompts, labels, batches[b].begin, batches[b].end);
      STRATA_RETURN_IF_ERROR(SetUpRequest(*t, url_, options_, pinning_->resolve.get(), pinning_->headers.get()));
      STRATA_RETURN_IF_ERROR(transfers.Add(std::move(t)));
      ++batches[b].tries;
      ++scores.requests;
    }
    int running = 0;
    if (const CURLMcode rc = curl_multi_perform(transfers.multi(), &running); rc != CURLM_OK) {
      return absl::InternalError(absl::StrCat("curl_multi_perform: ", curl_multi_strerror(rc)));
    }
    int queued = 0;
    while (CURLMsg* msg = curl_multi_info_read(transfers.multi(), &queued)) {
      if (msg->msg != CURLMSG_DONE) continue;
      const CURLcode result = msg->data.result;
      std::unique_ptr<Transfer> t = transfers.Remove(msg->easy_handle);
      if (t == nullptr) continue;
      Batch& batch = batches[t->batch];
      Attempt attempt = Judge(*t, result, batch.begin, batch.end - batch.begin, url_);
      if (attempt.kind == Attempt::kFail) return attempt.status;
      if (attempt.kind == Attempt::kReply) {
        replies[t->batch] = std::move(attempt.reply);
        ++answered;
        continue;
      }
      if (batch.tries > options_.retries) {
        return absl::UnavailableError(absl::StrCat("reward server ", url_, " (", addresses_, ") failed ", batch.tries,
                                                   batch.tries == 1 ? " try" : " tries",
                                                   "; the last: ", attempt.error));
      }
      const auto wait = Backoff(options_.backoff_s, batch.tries);
      STRATA_LOG(Warning) << "reward server " << url_ << ": " << attempt.error << "; try " << batch.tries + 1 << " of "
                          << options_.retries + 1 << " in "
                          << std::chrono::duration_cast<std::chrono::milliseconds>(wait).count() << " ms";
      batch.next_try = Clock::now() + wait;
      waiting.push_back(t->batch);
    }
    if (answered == batches.size()) break;
    // Sleep in curl until a socket is ready or the next retry is due.
    now = Clock::now();
    auto until = now + std::chrono::seconds(1);
    for (const size_t b : waiting) until = std::min(until, batches[b].next_try);
    if (!ready.empty() && transfers.size() < static_cast<size_t>(options_.max_in_flight)) until = now;
    const int wait_ms = static_cast<int>(std::max<int64_t>(
        0,
        std::chrono::duration_cast<std::chrono::milliseconds>(until - now + std::chrono::microseconds(999)).count()));
    if (const CURLMcode rc = curl_multi_poll(transfers.multi(), nullptr, 0, wait_ms, nullptr); rc != CURLM_OK) {
      return absl::InternalError(absl::StrCat("curl_multi_poll: ", curl_multi_strerror(rc)));
    }
  }
  RemoteScores merged = MergeRewardReplies(std::move(replies));
  merged.requests = scores.requests;
  merged.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return merged;
}

}  // namespace strata::rewards
