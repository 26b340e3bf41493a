// Ranks as threads of one process, meeting over loopback as separate
// processes would: rendezvous, collectives, and the failure bounds.
#include "policies/dist/process_group.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <csignal>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata::policies {
namespace {

using std::chrono::milliseconds;

// Runs `body(rank, group)` on every rank of a fresh group of `world` ranks.
template <typename Body>
void OnEveryRank(int world, Body body, milliseconds timeout = milliseconds(20000)) {
  auto host = Rendezvous::Host("127.0.0.1", 0, world, timeout);
  ASSERT_TRUE(host.ok()) << host.status();
  const int port = (*host)->port();
  const std::string secret = (*host)->secret();
  ASSERT_GT(port, 0);
  std::vector<std::thread> others;
  auto run = [&](int rank, std::unique_ptr<Rendezvous> rendezvous) {
    if (rendezvous == nullptr) {
      auto joined = Rendezvous::Join("127.0.0.1", port, secret, timeout);
      ASSERT_TRUE(joined.ok()) << joined.status();
      rendezvous = std::move(*joined);
    }
    ProcessGroupOptions options;
    options.rank = rank;
    options.world_size = world;
    options.timeout = timeout;
    auto group = ProcessGroup::Create(options, std::move(rendezvous));
    ASSERT_TRUE(group.ok()) << group.status();
    body(rank, **group);
  };
  for (int rank = 1; rank < world; ++rank) others.emplace_back(run, rank, nullptr);
  run(0, std::move(*host));
  for (auto& t : others) t.join();
}

TEST(ProcessGroupTest, TwoRanksSumBroadcastAndMeet) {
  if (!ProcessGroup::Available(Backend::kGloo)) GTEST_SKIP() << "this build has no Gloo";
  std::vector<at::Tensor> sums(2), broadcasts(2);
  OnEveryRank(2, [&](int rank, ProcessGroup& group) {
    EXPECT_EQ(group.rank(), rank);
    EXPECT_EQ(group.world_size(), 2);
    std::vector<at::Tensor> tensors = {at::full({3}, static_cast<float>(rank + 1)),
                                       at::arange(4, at::kDouble) * (rank + 1)};
    const absl::Status reduced = group.AllReduceSum(tensors);
    EXPECT_TRUE(reduced.ok()) << reduced;
    sums[static_cast<size_t>(rank)] = tensors[1];
    EXPECT_TRUE(tensors[0].equal(at::full({3}, 3.0f)));
    std::vector<at::Tensor> b = {at::full({2}, static_cast<int64_t>(10 + rank))};
    EXPECT_TRUE(group.Broadcast(b, 1).ok());
    broadcasts[static_cast<size_t>(rank)] = b[0];
    EXPECT_TRUE(group.Barrier().ok());
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(sums[static_cast<size_t>(rank)].equal(at::arange(4, at::kDouble) * 3)) << "rank " << rank;
    EXPECT_TRUE(broadcasts[static_cast<size_t>(rank)].equal(at::full({2}, int64_t{11}))) << "rank " << rank;
  }
}

// ZeRO-2's sum: each rank needs only the tensors it owns summed (Gloo does
// it as an all-reduce, NCCL as a reduce-scatter).
TEST(ProcessGroupTest, ReduceScatterSumsWhatEachRankOwns) {
  if (!ProcessGroup::Available(Backend::kGloo)) GTEST_SKIP() << "this build has no Gloo";
  std::vector<at::Tensor> kept(2);
  OnEveryRank(2, [&](int rank, ProcessGroup& group) {
    const float base = static_cast<float>(rank + 1);
    std::vector<std::vector<at::Tensor>> owned = {{at::full({3}, base), at::full({1}, 2 * base)},
                                                  {at::full({5}, 10 * base)}};
    const at::Tensor mine = owned[static_cast<size_t>(rank)][0];
    ASSERT_TRUE(group.StartReduceScatterSum(owned).ok());
    ASSERT_TRUE(group.WaitPending(0).ok());
    kept[static_cast<size_t>(rank)] = mine;
  });
  EXPECT_TRUE(kept[0].equal(at::full({3}, 3.0f)));   // 1 + 2
  EXPECT_TRUE(kept[1].equal(at::full({5}, 30.0f)));  // 10 + 20
}

TEST(ProcessGroupTest, OneRankIsItsOwnGang) {
  if (!ProcessGroup::Available(Backend::kGloo)) GTEST_SKIP() << "this build has no Gloo";
  OnEveryRank(1, [](int, ProcessGroup& group) {
    std::vector<at::Tensor> tensors = {at::full({2}, 5.0f)};
    EXPECT_TRUE(group.AllReduceSum(tensors).ok());
    EXPECT_TRUE(tensors[0].equal(at::full({2}, 5.0f)));
  });
}

// Rank 0 all-reduces; rank 1 holds its group open without joining the
// collective until rank 0 is done (a hung rank), or drops it (a dead rank).
// Both meet in a barrier first: a rank that dropped its group while its
// peer was still connecting would fail the peer's Create instead (a CI
// flake: "Connection closed by peer" before the collective).
absl::Status AllReduceAgainstAnAbsentRank(bool rank1_hangs) {
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  absl::Status result;
  OnEveryRank(
      2,
      [&](int rank, ProcessGroup& group) {
        const absl::Status formed = group.Barrier();
        EXPECT_TRUE(formed.ok()) << formed;
        if (rank == 1) {
          if (rank1_hangs) done.wait();
          return;
        }
        std::vector<at::Tensor> tensors = {at::ones({4})};
        const auto start = std::chrono::steady_clock::now();
        result = group.AllReduceSum(tensors);
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
        rank0_done.set_value();
      },
      milliseconds(1000));
  return result;
}

TEST(ProcessGroupTest, ARankThatHangsIsADeadlineNotAHang) {
  if (!ProcessGroup::Available(Backend::kGloo)) GTEST_SKIP() << "this build has no Gloo";
  const absl::Status s = AllReduceAgainstAnAbsentRank(/*rank1_hangs=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("all-reduce on rank 0 of 2"), absl::string_view::npos) << s;
}

TEST(ProcessGroupTest, ARankThatLeavesFailsTheCollective) {
  if (!ProcessGroup::Available(Backend::kGloo)) GTEST_SKIP() << "this build has no Gloo";
  const absl::Status s = AllReduceAgainstAnAbsentRank(/*rank1_hangs=*/false);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded) << s;
}

TEST(ProcessGroupTest, NobodyToJoinIsAnErrorWithinTheTimeout) {
  if (!ProcessGroup::Available(Backend::kGloo) && !ProcessGroup::Available(Backend::kNccl)) {
    GTEST_SKIP() << "this build has no c10d";
  }
  // A port with no store behind it: take a free one, then close it.
  int port = 0;
  {
    auto host = Rendezvous::Host("127.0.0.1", 0, 2, milliseconds(1000));
    ASSERT_TRUE(host.ok()) << host.status();
    port = (*host)->port();
  }
  auto joined = Rendezvous::Join("127.0.0.1", port, std::string(32, 'a'), milliseconds(1000));
  ASSERT_FALSE(joined.ok());
  EXPECT_TRUE(joined.status().code() == absl::StatusCode::kDeadlineExceeded ||
              joined.status().code() == absl::StatusCode::kUnavailable)
      << joined.status();
}

TEST(ProcessGroupTest, OptionsAreValidatedByName) {
  if (!ProcessGroup::Available(Backend::kGloo) && !ProcessGroup::Available(Backend::kNccl)) {
    GTEST_SKIP() << "this build has no c10d";
  }
  ProcessGroupOptions options;
  options.world_size = 2;
  options.rank = 2;
  EXPECT_NE(options.Validate().message().find("rank"), absl::string_view::npos);
  options.rank = 0;
  options.world_size = 0;
  EXPECT_NE(options.Validate().message().find("world_size"), absl::string_view::npos);
  options.world_size = 1;
  options.timeout = milliseconds(999);  // c10d would not wait at all
  EXPECT_NE(options.Validate().message().find("timeout"), absl::string_view::npos);
  EXPECT_EQ(Rendezvous::Join("127.0.0.1", 1, std::string(32, 'a'), milliseconds(10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const std::string& secret : {std::string(), std::string(31, 'a'), std::string(32, 'A'), std::string(33, '0')}) {
    const absl::Status bad = Rendezvous::Join("127.0.0.1", 1, secret, milliseconds(5000)).status();
    EXPECT_NE(bad.message().find("secret"), absl::string_view::npos) << bad;
  }
  EXPECT_EQ(Rendezvous::Host("127.0.0.1", 70000, 1, milliseconds(100)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProcessGroupTest, NamedBackendBuildsAGroupOfOne) {
  ProcessGroup::InProcessOptions options;
  options.group_of_one = true;
  options.timeout = milliseconds(20000);
  if (!ProcessGroup::Available(Backend::kGloo)) {
    EXPECT_EQ(ProcessGroup::CreateInProcess(1, options).status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  auto groups = ProcessGroup::CreateInProcess(1, options);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ProcessGroup& group = *(*groups)[0];
  EXPECT_EQ(group.backend(), Backend::kGloo);
  std::vector<at::Tensor> tensors = {at::full({2}, 5.0f)};
  ASSERT_TRUE(group.AllReduceSum(tensors).ok());
  EXPECT_TRUE(tensors[0].equal(at::full({2}, 5.0f)));
  EXPECT_TRUE(group.Barrier().ok());
}

TEST(ProcessGroupTest, NcclRanksOfOneProcessAreRefusedByName) {
  ProcessGroup::InProcessOptions options;
  options.backend = Backend::kNccl;
  const auto groups = ProcessGroup::CreateInProcess(2, options);
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(groups.status().message().find("one worker process per GPU"), absl::string_view::npos) << groups.status();
}

TEST(ProcessGroupTest, WithoutNcclTheBackendIsUnimplemented) {
  if (ProcessGroup::Available(Backend::kNccl)) GTEST_SKIP() << "this build has NCCL";
  ProcessGroup::InProcessOptions options;
  options.backend = Backend::kNccl;
  options.group_of_one = true;
  const auto groups = ProcessGroup::CreateInProcess(1, options);
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kUnimplemented) << groups.status();
  EXPECT_NE(groups.status().message().find("gloo"), absl::string_view::npos) << groups.status();
  // What a worker checks before it joins a rendezvous: the same answer.
  EXPECT_EQ(ProcessGroup::CheckAvailable(Backend::kNccl).code(), absl::StatusCode::kUnimplemented);
}

// The check each rank makes before a rendezvous says what the build lacks
// (NCCL on this machine; Gloo on the GPU machine's wheel build).
TEST(ProcessGroupTest, CheckAvailableNamesWhatTheBuildLacks) {
  for (const Backend backend : {Backend::kGloo, Backend::kNccl}) {
    if (ProcessGroup::Available(backend)) continue;
    const absl::Status status = ProcessGroup::CheckAvailable(backend);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
    EXPECT_NE(status.message().find(absl::StrCat("this build has no ", backend == Backend::kGloo ? "Gloo" : "NCCL")),
              absl::string_view::npos)
        << status;
  }
}

// NCCL on one GPU (world size 1): host tensors go through the device and
// back, device tensors are summed in place, buckets are flattened. A sum
// over one rank is the tensor itself, so what this checks is the plumbing:
// every value comes back where it was, and nothing is left on the stream.
TEST(ProcessGroupTest, NcclGroupOfOneOnTheGpu_CUDA) {
  if (!ProcessGroup::Available(Backend::kNccl) || !at::hasCUDA()) GTEST_SKIP() << "needs NCCL and a GPU";
  ProcessGroup::InProcessOptions options;
  options.backend = Backend::kNccl;
  options.group_of_one = true;
  options.timeout = milliseconds(60000);
  auto groups = ProcessGroup::CreateInProcess(1, options);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ProcessGroup& group = *(*groups)[0];
  EXPECT_EQ(group.backend(), Backend::kNccl);
  const at::Tensor host_values = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor device_values = at::arange(5, at::kDouble).to(at::Device(at::kCUDA, 0)) * 2;
  std::vector<at::Tensor> tensors = {host_values.clone(), device_values.clone()};
  ASSERT_TRUE(group.AllReduceSum(tensors).ok());
  EXPECT_TRUE(tensors[0].is_cpu());
  EXPECT_TRUE(tensors[0].equal(host_values));
  EXPECT_TRUE(tensors[1].equal(device_values));
  std::vector<at::Tensor> broadcast = {at::full({4}, int64_t{7})};
  ASSERT_TRUE(group.Broadcast(broadcast, 0).ok());
  EXPECT_TRUE(broadcast[0].equal(at::full({4}, int64_t{7})));
  // A bucket of host gradients, as the trainer hands them over.
  std::vector<at::Tensor> bucket = {at::full({3, 2}, 1.5f), at::arange(7, at::kFloat)};
  const std::vector<at::Tensor> expected = {bucket[0].clone(), bucket[1].clone()};
  ASSERT_TRUE(group.StartAllReduceSum(bucket).ok());
  bucket[0].zero_();  // the group sums its own flat copy; the wait writes it back
  bucket[1].zero_();
  ASSERT_TRUE(group.WaitPending(0).ok());
  EXPECT_TRUE(bucket[0].equal(expected[0]));
  EXPECT_TRUE(bucket[1].equal(expected[1]));
  // ZeRO-2's reduce-scatter: this rank owns both tensors of unequal sizes.
  std::vector<std::vector<at::Tensor>> owned = {{bucket[0], bucket[1]}};
  ASSERT_TRUE(group.StartReduceScatterSum(owned).ok());
  bucket[0].zero_();
  bucket[1].zero_();
  ASSERT_TRUE(group.WaitPending(0).ok());
  EXPECT_TRUE(bucket[0].equal(expected[0]));
  EXPECT_TRUE(bucket[1].equal(expected[1]));
  EXPECT_TRUE(group.Barrier().ok());
}

// The leftover of the last round: a process that reaches rank 0's store
// joins or misleads the gang. The stray here knows the code, writes where
// Gloo looks for rank 0's address, and rank 1 would read it. Knowing the
// gang's secret (what the old fixed key prefix amounted to), it breaks the
// gang; without it, the gang forms and sums as if it were not there.
TEST(ProcessGroupTest, AProcessWithoutTheGangsSecretCannotMisleadIt) {
  if (!ProcessGroup::Available(Backend::kGloo)) GTEST_SKIP() << "this build has no Gloo";
  // A misled rank fails and closes its sockets while its peer may still be
  // writing to them: as in the strata binary (services/cli/main.cc), that
  // must be an error on the peer's call, not a SIGPIPE that ends the test.
  std::signal(SIGPIPE, SIG_IGN);
  const milliseconds timeout(2000);
  auto form = [&](bool stray_knows_secret) {
    auto host = Rendezvous::Host("127.0.0.1", 0, 2, timeout);
    EXPECT_TRUE(host.ok()) << host.status();
    const int port = (*host)->port();
    const std::string secret = (*host)->secret();
    c10d::TCPStoreOptions stray_options;
    stray_options.port = static_cast<uint16_t>(port);
    stray_options.isServer = false;
    stray_options.timeout = timeout;
    c10d::TCPStore stray("127.0.0.1", stray_options);
    const std::string prefix = stray_knows_secret ? "strata/" + secret : "strata";
    const std::vector<uint8_t> garbage(64, 0xAB);
    // Rank 0 writes its address and then waits for rank 1's; rank 1 starts
    // only after the stray has written over rank 0's key, and Gloo's rank 1
    // reads it. The stray's write thus always lands after rank 0's and
    // before rank 1 reads, whatever the scheduler does (a stray racing the
    // ranks lost at random under load). Not the other way round: Gloo's
    // rank 1 writes nothing before rank 0 has started.
    std::promise<void> stray_wrote;
    std::shared_future<void> rank1_may_start = stray_wrote.get_future().share();
    std::vector<absl::Status> statuses(2);
    std::vector<float> sums(2, 0.0f);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r, rendezvous = r == 0 ? std::move(*host) : nullptr]() mutable {
        if (rendezvous == nullptr) {
          auto joined = Rendezvous::Join("127.0.0.1", port, secret, timeout);
          if (!joined.ok()) {
            statuses[static_cast<size_t>(r)] = joined.status();
            return;
          }
          rendezvous = std::move(*joined);
          rank1_may_start.wait();
        }
        ProcessGroupOptions options;
        options.rank = r, options.world_size = 2, options.timeout = timeout;
        auto group = ProcessGroup::Create(options, std::move(rendezvous));
        if (!group.ok()) {
          statuses[static_cast<size_t>(r)] = group.status();
          return;
        }
        std::vector<at::Tensor> x = {at::full({1}, static_cast<float>(r + 1))};
        statuses[static_cast<size_t>(r)] = (*group)->AllReduceSum(x);
        sums[static_cast<size_t>(r)] = x[0].item<float>();
      });
    }
    // The harness knows the secret and waits for rank 0's real key; the
    // stray writes under its own prefix, the gang's only if it knows it.
    try {
      stray.wait({"strata/" + secret + "/0/0"});
      stray.set(prefix + "/0/0", garbage);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank 0 never wrote its address: " << e.what();
    }
    stray_wrote.set_value();
    for (auto& t : ranks) t.join();
    return std::make_pair(statuses, sums);
  };
  const auto [misled, unused] = form(/*stray_knows_secret=*/true);
  EXPECT_FALSE(misled[0].ok() && misled[1].ok())
      << "the stray's address was not where Gloo looks: the test proves nothing";
  const auto [statuses, sums] = form(/*stray_knows_secret=*/false);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(statuses[static_cast<size_t>(r)].ok()) << statuses[static_cast<size_t>(r)];
    EXPECT_EQ(sums[static_cast<size_t>(r)], 3.0f);
  }
}

}  // namespace
}  // namespace strata::policies
