// Remote rewards against a real server process on loopback
// (reward_server.py: its paths pick the behaviour, and it records every
// request it receives), plus the allow list and the wire format alone.
#include "rewards/remote/remote_reward.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/interrupt.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "rewards/remote/reward_protocol.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/reward_server.h"
#include "tests/testutil/testutil.h"

extern char** environ;

namespace strata::rewards {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::RewardServer;

// Allows `server`'s address and port, nothing else.
HostAllowList Allowed(const RewardServer& server) {
  return *HostAllowList::Parse({absl::StrCat("127.0.0.1:", server.port())});
}

// A status's message as a std::string (gmock prints Debian Abseil's own
// string_view character by character).
std::string Message(const absl::Status& status) { return std::string(status.message()); }

// Short limits: every failing scenario below ends well under a second.
RemoteRewardOptions TestOptions(const std::string& url) {
  RemoteRewardOptions o;
  o.url = url;
  o.timeout_s = 5;
  o.retries = 2;
  o.backoff_s = 0.01;
  return o;
}

struct Queries {
  std::vector<std::string> queries, prompts, labels;
};

// n queries "P<i> says A<i%3>" with prompts "P<i>" and labels "A<i>": the
// label occurs in every third query.
Queries MakeQueries(size_t n) {
  Queries q;
  for (size_t i = 0; i < n; ++i) {
    q.prompts.push_back(absl::StrCat("P", i));
    q.queries.push_back(absl::StrCat("P", i, " says A", i % 3 == 0 ? i : i + 1));
    q.labels.push_back(absl::StrCat("A", i));
  }
  return q;
}

class RemoteRewardClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveProgram("python3")) GTEST_SKIP() << "python3 is not on PATH: no reward server to test against";
    auto server = RewardServer::Start({"--token", "s3cret-token", "--sleep", "10"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  absl::StatusOr<RemoteScores> ScoreAt(const std::string& path, RemoteRewardOptions options, size_t n = 4) {
    options.url = server_->Url(path);
    auto client = RemoteRewardClient::Create(options, Allowed(*server_));
    if (!client.ok()) return client.status();
    const Queries q = MakeQueries(n);
    return (*client)->Score(q.queries, q.prompts, q.labels);
  }

  std::unique_ptr<RewardServer> server_;
};

TEST(HostAllowListTest, ParsesHostsPortsAndBracketedIpv6) {
  auto list = HostAllowList::Parse(
      {"RM.Internal", "example.org:8443", "10.0.0.7:9000", "[0:0:0:0:0:0:0:1]:8000", "[fe80::1]", "trailing.dot."});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_FALSE(list->empty());
  EXPECT_TRUE(HostAllowList().empty());
  EXPECT_FALSE(HostAllowList().Allows("127.0.0.1", 80));
  // Without a port: every port; names compare case-insensitively.
  EXPECT_TRUE(list->Allows("rm.internal", 80));
  EXPECT_TRUE(list->Allows("rm.INTERNAL.", 12345));
  // With a port: only that one.
  EXPECT_TRUE(list->Allows("example.org", 8443));
  EXPECT_FALSE(list->Allows("example.org", 443));
  EXPECT_TRUE(list->Allows("10.0.0.7", 9000));
  EXPECT_FALSE(list->Allows("10.0.0.7", 9001));
  EXPECT_FALSE(list->Allows("10.0.0.8", 9000));
  // IPv6 compares canonically, in brackets as a URL writes it.
  EXPECT_TRUE(list->Allows("[::1]", 8000));
  EXPECT_FALSE(list->Allows("[::1]", 8001));
  EXPECT_TRUE(list->Allows("[FE80:0::1]", 1));
  EXPECT_TRUE(list->Allows("trailing.dot", 1));
  // A subdomain, a parent or a lookalike is another host.
  EXPECT_FALSE(list->Allows("a.rm.internal", 80));
  EXPECT_FALSE(list->Allows("internal", 80));
  EXPECT_FALSE(list->Allows("rm.internal.evil.example", 80));
  EXPECT_EQ(list->ToString(), "rm.internal, example.org:8443, 10.0.0.7:9000, [::1]:8000, [fe80::1], trailing.dot");
}

TEST(HostAllowListTest, ANameDoesNotAllowItsAddressNorTheReverse) {
  auto list = HostAllowList::Parse({"localhost", "127.0.0.1:9"});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_FALSE(list->Allows("127.0.0.1", 80));
  EXPECT_FALSE(list->Allows("localhost.localdomain", 9));
  EXPECT_TRUE(list->Allows("localhost", 80));
}

TEST(HostAllowListTest, RefusesMalformedEntries) {
  for (const std::string entry : {"",
                                  "http://rm.internal",
                                  "rm.internal/score",
                                  "*.example.org",
                                  "::1",
                                  "[::1",
                                  "[::1]x",
                                  "[::1]:",
                                  "[fe80::1%eth0]",
                                  "rm:0",
                                  "rm:65536",
                                  "rm:80a",
                                  "rm:",
                                  "rm:-1",
                                  "bad host",
                                  "bad!host",
                                  "-rm.internal",
                                  "a..b",
                                  "10.0.0",
                                  "2130706433",
                                  "[1.2.3.4]"}) {
    const auto list = HostAllowList::Parse({"ok.example", entry});
    EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument) << "entry \"" << entry << "\"";
    EXPECT_THAT(Message(list.status()), HasSubstr("--allow-reward-host")) << entry;
  }
}

TEST(RemoteRewardOptionsTest, ValidateNamesTheField) {
  EXPECT_TRUE(TestOptions("http://rm").Validate().ok());
  auto with = [](auto change) {
    RemoteRewardOptions o = TestOptions("http://rm");
    change(o);
    return std::string(o.Validate().message());
  };
  EXPECT_THAT(with([](auto& o) { o.url = ""; }), HasSubstr("url"));
  EXPECT_THAT(with([](auto& o) { o.batch_size = 0; }), HasSubstr("batch_size"));
  EXPECT_THAT(with([](auto& o) { o.max_in_flight = 0; }), HasSubstr("max_in_flight"));
  EXPECT_THAT(with([](auto& o) { o.max_in_flight = 65; }), HasSubstr("max_in_flight"));
  EXPECT_THAT(with([](auto& o) { o.timeout_s = 0; }), HasSubstr("timeout_s"));
  EXPECT_THAT(with([](auto& o) { o.timeout_s = std::nan(""); }), HasSubstr("timeout_s"));
  EXPECT_THAT(with([](auto& o) { o.retries = -1; }), HasSubstr("retries"));
  EXPECT_THAT(with([](auto& o) { o.backoff_s = 3; }), HasSubstr("backoff_s"));
  const std::string token_error = with([](auto& o) { o.bearer_token = "abc\r\nX-Evil: 1"; });
  EXPECT_THAT(token_error, HasSubstr("bearer_token"));
  EXPECT_THAT(token_error, Not(HasSubstr("abc")));
}

TEST(RemoteRewardClientCreateTest, OnlyHttpAndHttpsUrlsAreAccepted) {
  const auto allowed = *HostAllowList::Parse({"127.0.0.1", "rm.example"});
  for (const std::string url : {"ftp://127.0.0.1/rewards", "file:///etc/passwd", "gopher://127.0.0.1/",
                                "dict://127.0.0.1:11211/", "127.0.0.1:8000/no-scheme", "http://"}) {
    const auto client = RemoteRewardClient::Create(TestOptions(url), allowed);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << url << ": " << client.status();
  }
  const auto with_user = RemoteRewardClient::Create(TestOptions("http://user:pw@127.0.0.1/"), allowed);
  EXPECT_EQ(with_user.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(with_user.status()), Not(HasSubstr("pw")));
  // https is accepted (nothing is contacted at Create for an IP literal).
  EXPECT_TRUE(RemoteRewardClient::Create(TestOptions("https://127.0.0.1:8443/score"), allowed).ok());
  EXPECT_TRUE(RemoteRewardClient::Create(TestOptions("HTTP://127.0.0.1/score"), allowed).ok());
  // A missing CA file is named.
  RemoteRewardOptions ca = TestOptions("https://127.0.0.1/score");
  ca.ca_file = "/nonexistent/ca.pem";
  const auto no_ca = RemoteRewardClient::Create(ca, allowed);
  EXPECT_EQ(no_ca.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(no_ca.status()), HasSubstr("ca_file"));
}

TEST(RemoteRewardClientCreateTest, TheHostIsTheOneCurlWouldConnectTo) {
  // Userinfo and numeric forms that a second URL parser could read as an
  // allowed host: curl's parser decides, and the check sees its answer.
  const auto allowed = *HostAllowList::Parse({"rm.example", "127.0.0.1:80"});
  EXPECT_EQ(RemoteRewardClient::Create(TestOptions("http://rm.example@10.0.0.9/"), allowed).status().code(),
            absl::StatusCode::kInvalidArgument);  // credentials
  EXPECT_EQ(RemoteRewardClient::Create(TestOptions("http://10.0.0.9#@rm.example/"), allowed).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(RemoteRewardClient::Create(TestOptions("http://127.0.0.1:81/"), allowed).status().code(),
            absl::StatusCode::kPermissionDenied);
  // 2130706433 is 127.0.0.1 to curl; allowed on port 80 only.
  auto numeric = RemoteRewardClient::Create(TestOptions("http://2130706433/"), allowed);
  ASSERT_TRUE(numeric.ok()) << numeric.status();
  EXPECT_EQ((*numeric)->pinned_addresses(), "127.0.0.1");
  EXPECT_EQ(RemoteRewardClient::Create(TestOptions("http://2130706433:81/"), allowed).status().code(),
            absl::StatusCode::kPermissionDenied);
  // IPv6 literals compare canonically.
  auto v6 = RemoteRewardClient::Create(TestOptions("http://[0::1]:8000/score"), *HostAllowList::Parse({"[::1]:8000"}));
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ((*v6)->pinned_addresses(), "[::1]");
}

TEST_F(RemoteRewardClientTest, ScoresArriveInQueryOrderAcrossConcurrentBatches) {
  RemoteRewardOptions options = TestOptions(server_->Url("/ok"));
  options.batch_size = 3;
  options.max_in_flight = 4;
  auto client = RemoteRewardClient::Create(options, Allowed(*server_));
  ASSERT_TRUE(client.ok()) << client.status();
  Queries q = MakeQueries(10);
  // Every batch overlaps the others, and the first answers last.
  for (auto& p : q.prompts) p = "sleep:0.1";
  q.prompts[0] = "sleep:0.3";
  for (size_t i = 0; i < q.queries.size(); ++i) q.queries[i] = absl::StrCat(q.prompts[i], q.queries[i]);
  const auto scores = (*client)->Score(q.queries, q.prompts, q.labels);
  ASSERT_TRUE(scores.ok()) << scores.status() << "\n" << server_->Log();

  ASSERT_EQ(scores->rewards.size(), 10u);
  ASSERT_EQ(scores->scores.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    const double hit = i % 3 == 0 ? 1.0 : 0.0;
    EXPECT_EQ(scores->rewards[i], static_cast<double>(q.queries[i].size()) + 0.5 * hit) << i;
    EXPECT_THAT(scores->scores[i], ElementsAre(hit)) << i;
    EXPECT_EQ(scores->extra_logs["query_len"][i], q.queries[i].size()) << i;
  }
  // A per-batch scalar is repeated for each query of its batch.
  EXPECT_EQ(scores->extra_logs["batch"], json({3, 3, 3, 3, 3, 3, 3, 3, 3, 1}));
  EXPECT_FALSE(scores->extra_logs.contains("unknown_field"));
  EXPECT_EQ(scores->requests, 4);
  EXPECT_GT(scores->seconds, 0.3);  // the first batch slept

  // The server saw the protocol: one POST per batch with the three lists.
  const std::vector<json> requests = server_->Requests();
  ASSERT_EQ(requests.size(), 4u);
  std::vector<std::string> seen_queries;
  int most_in_flight = 0;
  for (const json& r : requests) {
    EXPECT_EQ(r["path"], "/ok");
    EXPECT_EQ(r["content_type"], "application/json");
    EXPECT_TRUE(r["authorization"].is_null());
    const json& body = r["body"];
    ASSERT_TRUE(body.is_object()) << r;
    const size_t begin = std::find(q.queries.begin(), q.queries.end(), body["query"][0]) - q.queries.begin();
    ASSERT_EQ(begin % 3, 0u) << r;
    const size_t end = std::min<size_t>(begin + 3, q.queries.size());
    EXPECT_EQ(body["query"], json(std::vector<std::string>(q.queries.begin() + begin, q.queries.begin() + end)));
    EXPECT_EQ(body["prompts"], json(std::vector<std::string>(q.prompts.begin() + begin, q.prompts.begin() + end)));
    EXPECT_EQ(body["labels"], json(std::vector<std::string>(q.labels.begin() + begin, q.labels.begin() + end)));
    for (const json& query : body["query"]) seen_queries.push_back(query);
    most_in_flight = std::max(most_in_flight, r["in_flight"].get<int>());
  }
  EXPECT_EQ(seen_queries.size(), q.queries.size());  // each query sent once
  EXPECT_GE(most_in_flight, 2) << "batches were sent one at a time";
}

TEST_F(RemoteRewardClientTest, AtMostMaxInFlightRequestsAtOnce) {
  RemoteRewardOptions options = TestOptions(server_->Url("/ok"));
  options.batch_size = 1;
  options.max_in_flight = 2;
  auto client = RemoteRewardClient::Create(options, Allowed(*server_));
  ASSERT_TRUE(client.ok()) << client.status();
  Queries q = MakeQueries(4);
  for (auto& p : q.prompts) p = "sleep:0.1";
  const auto scores = (*client)->Score(q.queries, q.prompts, q.labels);
  ASSERT_TRUE(scores.ok()) << scores.status();
  int most_in_flight = 0;
  for (const json& r : server_->Requests()) most_in_flight = std::max(most_in_flight, r["in_flight"].get<int>());
  EXPECT_LE(most_in_flight, 2);
  EXPECT_EQ(scores->requests, 4);
}

TEST_F(RemoteRewardClientTest, EmptyCallSendsNothingAndMismatchedListsAreRefused) {
  auto client = RemoteRewardClient::Create(TestOptions(server_->Url("/ok")), Allowed(*server_));
  ASSERT_TRUE(client.ok()) << client.status();
  const auto empty = (*client)->Score({}, {}, {});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->rewards.empty());
  EXPECT_EQ(empty->requests, 0);
  EXPECT_EQ((*client)->Score({"a", "b"}, {"a"}, {"x", "y"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(server_->Requests().empty());
}

TEST_F(RemoteRewardClientTest, ACancelledJobSendsNothingMore) {
  RequestInterrupt();
  const auto scores = ScoreAt("/ok", TestOptions(""));
  ClearInterrupt();
  EXPECT_EQ(scores.status().code(), absl::StatusCode::kCancelled) << scores.status();
  EXPECT_TRUE(server_->Requests().empty());
}

TEST_F(RemoteRewardClientTest, ADownServerIsUnavailableAfterTheRetries) {
  auto port = testing::RedisServer::FreePort();  // nothing listens there
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string url = absl::StrCat("http://127.0.0.1:", *port, "/score");
  auto client = RemoteRewardClient::Create(TestOptions(url), *HostAllowList::Parse({"127.0.0.1"}));
  ASSERT_TRUE(client.ok()) << client.status();
  const Queries q = MakeQueries(2);
  const auto scores = (*client)->Score(q.queries, q.prompts, q.labels);
  EXPECT_EQ(scores.status().code(), absl::StatusCode::kUnavailable) << scores.status();
  EXPECT_THAT(Message(scores.status()), HasSubstr(url));
  EXPECT_THAT(Message(scores.status()), HasSubstr("3 tries"));
  EXPECT_THAT(Message(scores.status()), HasSubstr("onnect"));  // curl: "Failed to connect ... refused"
}

TEST_F(RemoteRewardClientTest, ASlowServerTimesOutAsUnavailable) {
  RemoteRewardOptions options = TestOptions("");
  options.timeout_s = 0.3;
  options.retries = 1;
  const auto scores = ScoreAt("/slow", options);
  EXPECT_EQ(scores.status().code(), absl::StatusCode::kUnavailable) << scores.status();
  EXPECT_THAT(Message(scores.status()), HasSubstr(server_->Url("/slow")));
  EXPECT_THAT(Message(scores.status()), HasSubstr("timed out"));
  // The first try and one retry. (Not counted at the server: the second
  // request may time out before the server's thread records it.)
  EXPECT_THAT(Message(scores.status()), HasSubstr("2 tries"));
}

TEST_F(RemoteRewardClientTest, ServerErrorsAreRetriedThenUnavailableWithTheStatusAndBody) {
  const auto scores = ScoreAt("/status_500", TestOptions(""));
  EXPECT_EQ(scores.status().code(), absl::StatusCode::kUnavailable) << scores.status();
  EXPECT_THAT(Message(scores.status()), HasSubstr(server_->Url("/status_500")));
  EXPECT_THAT(Message(scores.status()), HasSubstr("HTTP 500"));
  EXPECT_THAT(Message(scores.status()), HasSubstr("the reward model is not loaded"));
  EXPECT_LT(Message(scores.status()).size(), 700u);  // the body is cut
  EXPECT_EQ(server_->Requests().size(), 3u);         // 1 + retries
  EXPECT_EQ(ScoreAt("/status_429", TestOptions("")).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(RemoteRewardClientTest, ClientErrorsAreFailedPreconditionWithoutRetry) {
  const auto scores = ScoreAt("/status_404", TestOptions(""));
  EXPECT_EQ(scores.status().code(), absl::StatusCode::kFailedPrecondition) << scores.status();
  EXPECT_THAT(Message(scores.status()), HasSubstr("HTTP 404"));
  EXPECT_THAT(Message(scores.status()), HasSubstr(server_->Url("/status_404")));
  EXPECT_EQ(server_->Requests().size(), 1u);
}

TEST_F(RemoteRewardClientTest, RepliesOutsideTheProtocolAreFailedPreconditionNamingTheUrl) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/wrong_count", "\"rewards\" has 3 entries for 4 queries"},
      {"/nan", "NaN or Infinity"},
      {"/inf", "number overflow"},
      {"/string", "not a finite number: \\\"3\\\""},
      {"/list", "not a JSON object"},
      {"/no_rewards", "no \"rewards\""},
      {"/not_json", "not JSON"},
  };
  for (const auto& [path, message] : cases) {
    const auto scores = ScoreAt(path, TestOptions(""));
    EXPECT_EQ(scores.status().code(), absl::StatusCode::kFailedPrecondition) << path << ": " << scores.status();
    EXPECT_THAT(Message(scores.status()), HasSubstr(server_->Url(path))) << path;
    EXPECT_THAT(Message(scores.status()), HasSubstr(message)) << path;
  }
  EXPECT_EQ(server_->Requests().size(), cases.size());  // none retried
}

TEST_F(RemoteRewardClientTest, ADisallowedHostIsRefusedBeforeAnythingIsSent) {
  RemoteRewardOptions options = TestOptions(server_->Url("/ok"));
  for (const std::vector<std::string>& entries : std::vector<std::vector<std::string>>{
           {}, {"localhost"}, {absl::StrCat("127.0.0.1:", server_->port() + 1)}, {"127.0.0.2"}}) {
    const auto client = RemoteRewardClient::Create(options, *HostAllowList::Parse(entries));
    EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();
    EXPECT_THAT(Message(client.status()), HasSubstr(absl::StrCat("127.0.0.1:", server_->port())));
    EXPECT_THAT(Message(client.status()), HasSubstr("--allow-reward-host"));
  }
  EXPECT_TRUE(server_->Requests().empty());
}

TEST_F(RemoteRewardClientTest, ARedirectIsRefusedAndItsTargetNeverContacted) {
  // The target is this same server under a name the list does not allow:
  // had the client followed, the server would have recorded /landed.
  const std::string target = absl::StrCat("http://localhost:", server_->port(), "/landed");
  const auto scores = ScoreAt(absl::StrCat("/redirect?to=", target), TestOptions(""));
  EXPECT_EQ(scores.status().code(), absl::StatusCode::kPermissionDenied) << scores.status();
  EXPECT_THAT(Message(scores.status()), HasSubstr("HTTP 302"));
  EXPECT_THAT(Message(scores.status()), HasSubstr(target));
  EXPECT_THAT(server_->Paths(), ElementsAre("/redirect"));
}

TEST_F(RemoteRewardClientTest, TheBearerTokenReachesTheServer) {
  RemoteRewardOptions options = TestOptions("");
  options.bearer_token = "s3cret-token";
  const auto scores = ScoreAt("/auth", options);
  ASSERT_TRUE(scores.ok()) << scores.status();
  EXPECT_EQ(scores->rewards.size(), 4u);
  ASSERT_EQ(server_->Requests().size(), 1u);
  EXPECT_EQ(server_->Requests()[0]["authorization"], "Bearer s3cret-token");

  options.bearer_token = "wrong-token";
  const auto refused = ScoreAt("/auth", options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(Message(refused.status()), HasSubstr("HTTP 401"));
  EXPECT_THAT(Message(refused.status()), Not(HasSubstr("wrong-token")));
}

TEST_F(RemoteRewardClientTest, AHostNameIsPinnedToItsAddressAtCreate) {
  RemoteRewardOptions options = TestOptions(absl::StrCat("http://localhost:", server_->port(), "/ok"));
  auto client = RemoteRewardClient::Create(options, *HostAllowList::Parse({"localhost"}));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_THAT((*client)->pinned_addresses(), HasSubstr("127.0.0.1"));
  const Queries q = MakeQueries(2);
  const auto scores = (*client)->Score(q.queries, q.prompts, q.labels);
  ASSERT_TRUE(scores.ok()) << scores.status();
  ASSERT_EQ(server_->Requests().size(), 1u);
  EXPECT_EQ(server_->Requests()[0]["host"], absl::StrCat("localhost:", server_->port()));
}

TEST_F(RemoteRewardClientTest, AProxyFromTheEnvironmentIsIgnored) {
  auto port = testing::RedisServer::FreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string proxy = absl::StrCat("http://127.0.0.1:", *port);
  for (const char* name : {"http_proxy", "HTTPS_PROXY", "ALL_PROXY"}) ::setenv(name, proxy.c_str(), 1);
  const auto scores = ScoreAt("/ok", TestOptions(""));
  for (const char* name : {"http_proxy", "HTTPS_PROXY", "ALL_PROXY"}) ::unsetenv(name);
  ASSERT_TRUE(scores.ok()) << scores.status();  // a proxy there would have refused the connection
  EXPECT_EQ(server_->Requests().size(), 1u);
}

// The example a user starts from (examples/math_task/reward_server.py)
// speaks the protocol and scores as its header says.
TEST(MathTaskRewardServerTest, ScoresAnswersAndFormatAsDocumented) {
  if (!testing::HaveProgram("python3")) GTEST_SKIP() << "python3 is not on PATH";
  auto server = RewardServer::Start({"--port", "0"}, "examples/math_task/reward_server.py");
  ASSERT_TRUE(server.ok()) << server.status();
  RemoteRewardOptions options = TestOptions((*server)->Url("/"));
  auto client = RemoteRewardClient::Create(options, Allowed(**server));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string prompt = "<|im_start|>user\nMia has 7 apples and buys 5 more.<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<std::string> responses = {
      "7 + 5 = 12\n#### 12<|im_end|>",  // correct, formatted: 1.2
      "She has 12 apples.",             // correct (the last number), no format: 1.0
      "7 + 5 = 13\n#### 13",            // wrong, formatted: 0.2
      "#### 12.0",                      // equal to 12 as numbers: 1.2
      "I do not know",                  // no number: 0
  };
  std::vector<std::string> queries, prompts, labels;
  for (const std::string& r : responses) {
    queries.push_back(prompt + r);
    prompts.push_back(prompt);
    labels.push_back("12");
  }
  const auto scores = (*client)->Score(queries, prompts, labels);
  ASSERT_TRUE(scores.ok()) << scores.status() << "\n" << (*server)->Log();
  EXPECT_THAT(scores->rewards, ElementsAre(1.2, 1.0, 0.2, 1.2, 0.0));
  ASSERT_EQ(scores->scores.size(), 5u);
  EXPECT_THAT(scores->scores[1], ElementsAre(1.0));
  EXPECT_THAT(scores->scores[2], ElementsAre(0.0));
  EXPECT_EQ(scores->extra_logs["format"], json({1.0, 0.0, 1.0, 1.0, 0.0}));
}

TEST(RewardProtocolTest, ARequestBodyCarriesTheThreeListsAndSurvivesBrokenUtf8) {
  const json body = json::parse(
      RewardRequestBody({"q0", "q1\xff", "q2"}, {"p0", "p1", "p2"}, {"l0", "l1", "l2"}, 1, 3));
  EXPECT_EQ(body["query"], json({"q1\xEF\xBF\xBD", "q2"}));
  EXPECT_EQ(body["prompts"], json({"p1", "p2"}));
  EXPECT_EQ(body["labels"], json({"l1", "l2"}));
}

TEST(RewardProtocolTest, RepliesAreReadAsOpenRlhfReadsThem) {
  const std::string url = "http://rm/score";
  // serve_rm.py's reply, with an unknown field.
  auto reply = ParseRewardReply(
      R"({"rewards": [0.5, -1], "scores": [0.5, [1, 2]], "extra_logs": {"dummy_scores": [0.5, -1]}, "x": {}})", 2, 0,
      url);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_THAT(reply->rewards, ElementsAre(0.5, -1.0));
  ASSERT_EQ(reply->scores.size(), 2u);
  EXPECT_THAT(reply->scores[1], ElementsAre(1.0, 2.0));
  EXPECT_EQ(reply->extra_logs["dummy_scores"], json({0.5, -1}));
  // A bare number answers a request of one (torch.tensor([reward]) in OpenRLHF).
  auto one = ParseRewardReply(R"({"rewards": 2, "scores": null})", 1, 7, url);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(one->rewards, ElementsAre(2.0));
  EXPECT_TRUE(one->scores.empty());
  // ... but not of two; and bools, strings, nested depth, bad extra_logs fail.
  for (const auto& [body, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"rewards": 2})", "not a list"},
           {R"({"rewards": [true, 1]})", "query 7 is not a finite number: true"},
           {R"({"rewards": [1, 1], "scores": [1]})", "\"scores\" has 1 entries"},
           {R"({"rewards": [1, 1], "scores": [1, "x"]})", "\"scores\" of query 8"},
           {R"({"rewards": [1, 1], "extra_logs": [1]})", "\"extra_logs\" is not an object"},
           {R"({"rewards": [1, -Infinity]})", "NaN or Infinity"},
           {std::string(100, '[') + std::string(100, ']'), "deeper than 64"},
       }) {
    const auto bad = ParseRewardReply(body, 2, 7, url);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << body;
    EXPECT_THAT(Message(bad.status()), HasSubstr(message)) << body;
    EXPECT_THAT(Message(bad.status()), HasSubstr(url)) << body;
  }
}

TEST(RewardProtocolTest, MergedRepliesKeepQueryOrderAndSpreadTheLogs) {
  RewardReply a{{1, 2}, {{1}, {2}}, json{{"k", json::array({10, 20})}, {"scalar", "x"}}};
  RewardReply b{{3}, {}, nullptr};
  RewardReply c{{4, 5}, {}, json{{"k", 7}}};
  const RemoteScores merged = MergeRewardReplies({a, b, c});
  EXPECT_THAT(merged.rewards, ElementsAre(1, 2, 3, 4, 5));
  ASSERT_EQ(merged.scores.size(), 5u);
  EXPECT_THAT(merged.scores[1], ElementsAre(2.0));
  EXPECT_TRUE(merged.scores[2].empty());
  EXPECT_EQ(merged.extra_logs["k"], json({10, 20, nullptr, 7, 7}));
  EXPECT_EQ(merged.extra_logs["scalar"], json({"x", "x", nullptr, nullptr, nullptr}));
  const RemoteScores bare = MergeRewardReplies({b});
  EXPECT_TRUE(bare.scores.empty());
  EXPECT_TRUE(bare.extra_logs.is_null());
}

}  // namespace
}  // namespace strata::rewards
