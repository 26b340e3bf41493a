#include "services/coordinator/gang_plan.h"

#include "gtest/gtest.h"

namespace strata::services {
namespace {

using Gang = std::vector<std::string>;
constexpr WorkerState kFree = WorkerState::kFree;
constexpr WorkerState kBusy = WorkerState::kBusy;
constexpr WorkerState kKeptOut = WorkerState::kKeptOut;

QueuedGangJob Job(const std::string& id, int64_t workers, bool backing_off = false, const std::string& tenant = "") {
  QueuedGangJob job;
  job.id = id;
  job.tenant = tenant;
  job.workers = workers;
  job.backing_off = backing_off;
  return job;
}

TEST(PlanGangsTest, OldestFirstOnFreeWorkersInRankOrder) {
  const auto plan = PlanGangs({Job("a", 2), Job("b", 1), Job("c", 1)},
                              {{"w0", kFree}, {"w1", kBusy}, {"w2", kFree}, {"w3", kFree}});
  ASSERT_EQ(plan.decisions.size(), 3u);
  EXPECT_EQ(plan.decisions[0].gang, (Gang{"w0", "w2"}));
  EXPECT_EQ(plan.decisions[1].gang, (Gang{"w3"}));
  EXPECT_TRUE(plan.decisions[2].gang.empty());
  // c waits for a busy worker: no news, nothing held.
  EXPECT_EQ(plan.decisions[2].waiting, "");
  EXPECT_TRUE(plan.held.empty());
}

TEST(PlanGangsTest, AGangJobWaitingForBusyWorkersHoldsTheFreeOnes) {
  const auto plan = PlanGangs({Job("gang", 2), Job("small", 1)}, {{"w0", kBusy}, {"w1", kFree}});
  EXPECT_TRUE(plan.decisions[0].gang.empty());
  EXPECT_EQ(plan.decisions[0].waiting, "");
  EXPECT_TRUE(plan.decisions[1].gang.empty()) << "the younger job took the gang job's worker";
  EXPECT_EQ(plan.decisions[1].waiting,
            "waiting: queued behind job gang, which is older and needs 2 workers; the free ones are held for it");
  EXPECT_EQ(plan.held, (std::set<std::string>{"w1"}));
}

TEST(PlanGangsTest, AnotherTenantsJobIsNotNamed) {
  const auto plan = PlanGangs({Job("gang", 2, false, "alice"), Job("small", 1, false, "bob")},
                              {{"w0", kBusy}, {"w1", kFree}});
  EXPECT_EQ(plan.decisions[1].waiting,
            "waiting: queued behind a job, which is older and needs 2 workers; the free ones are held for it");
}

// After a lost gang the job waits out its backoff; the workers it would
// take are held meanwhile instead of going to younger jobs. Younger jobs
// still get the workers beyond them (and a younger gang job that then
// finds too few holds what is left).
TEST(PlanGangsTest, AGangJobInItsBackoffHoldsItsWorkersAndNoMore) {
  const auto plan = PlanGangs({Job("requeued", 2, /*backing_off=*/true), Job("small", 1), Job("pair", 2)},
                              {{"w0", kFree}, {"w1", kFree}, {"w2", kFree}, {"w3", kFree}});
  EXPECT_TRUE(plan.decisions[0].gang.empty());
  EXPECT_EQ(plan.decisions[0].waiting, "");
  EXPECT_EQ(plan.decisions[1].gang, (Gang{"w2"}));
  EXPECT_TRUE(plan.decisions[2].gang.empty());
  EXPECT_NE(plan.decisions[2].waiting.find("queued behind job requeued"), std::string::npos);
  EXPECT_EQ(plan.held, (std::set<std::string>{"w0", "w1", "w3"}));
}

// A job of one waits out its backoff without holding: it cannot be starved
// the way a gang job can (any one worker that frees serves it).
TEST(PlanGangsTest, AJobOfOneHoldsNothing) {
  const auto plan = PlanGangs({Job("requeued", 1, /*backing_off=*/true), Job("small", 1)}, {{"w0", kFree}});
  EXPECT_TRUE(plan.decisions[0].gang.empty());
  EXPECT_EQ(plan.decisions[1].gang, (Gang{"w0"}));
  EXPECT_TRUE(plan.held.empty());
}

// Waiting for a worker kept out after it stopped answering (it may never
// come back) holds nothing: the free workers go to younger jobs.
TEST(PlanGangsTest, NoHoldWhileTheGangNeedsAWorkerThatStoppedAnswering) {
  const auto plan = PlanGangs({Job("gang", 2), Job("small", 1)}, {{"w0", kKeptOut}, {"w1", kFree}});
  EXPECT_TRUE(plan.decisions[0].gang.empty());
  EXPECT_EQ(plan.decisions[1].gang, (Gang{"w1"}));
  EXPECT_TRUE(plan.held.empty());
}

TEST(PlanGangsTest, TooFewRegisteredIsToldAndHoldsNothing) {
  const auto plan = PlanGangs({Job("big", 3), Job("small", 1)}, {{"w0", kFree}, {"w1", kFree}});
  EXPECT_EQ(plan.decisions[0].waiting,
            "waiting: the job needs 3 workers (spec key 'parallel.workers'); 2 are registered");
  EXPECT_EQ(plan.decisions[1].gang, (Gang{"w0"}));
  const auto none = PlanGangs({Job("one", 1)}, {});
  EXPECT_EQ(none.decisions[0].waiting,
            "waiting: the job needs 1 worker (spec key 'parallel.workers'); 0 are registered");
}

// Two gang jobs waiting: each holds what it would take, in age order; a
// younger job is told about the first holder in its way.
TEST(PlanGangsTest, SeveralHoldersInAgeOrder) {
  const auto plan = PlanGangs({Job("first", 3), Job("second", 2), Job("small", 1)},
                              {{"w0", kBusy}, {"w1", kFree}, {"w2", kFree}, {"w3", kBusy}});
  EXPECT_EQ(plan.held, (std::set<std::string>{"w1", "w2"}));
  EXPECT_TRUE(plan.decisions[1].gang.empty());
  EXPECT_NE(plan.decisions[1].waiting.find("queued behind job first"), std::string::npos);
  EXPECT_TRUE(plan.decisions[2].gang.empty());
  EXPECT_NE(plan.decisions[2].waiting.find("queued behind job first"), std::string::npos);
}

// A job that continues an ended one waits until that job's run has stopped
// on its workers (it may still write the checkpoints the new job resumes),
// holding nothing meanwhile.
TEST(PlanGangsTest, AContinuationWaitsForTheRunItContinuesToStop) {
  QueuedGangJob continuation = Job("next", 2);
  continuation.waits_for = "ended";
  const auto plan = PlanGangs({continuation, Job("small", 1)}, {{"w0", kFree}, {"w1", kFree}});
  EXPECT_TRUE(plan.decisions[0].gang.empty());
  EXPECT_EQ(plan.decisions[0].waiting,
            "waiting: job ended, which this job continues, is still stopping on its workers");
  EXPECT_EQ(plan.decisions[1].gang, (Gang{"w0"}));
  EXPECT_TRUE(plan.held.empty());
}

}  // namespace
}  // namespace strata::services

namespace strata::services {
namespace {

// A worker whose build lacks a job's backend (or that has no GPU for a GPU
// job) is never offered it: a mixed gang's ranks would wait for it until
// the collective timeout. A worker that says nothing of itself (an older
// build) is offered anything.
TEST(PlanGangsTest, AJobGoesOnlyToWorkersThatRunWhatItNeeds) {
  QueuedGangJob gloo_gang{"gang", "", 2, false, "", {"gloo"}};
  QueuedGangJob gpu{"gpu", "", 1, false, "", {"cuda"}};
  const std::set<std::string> cpu_only = {"gloo"}, nothing = {};
  std::vector<SchedulableWorker> workers = {{"w0", WorkerState::kFree, nothing},
                                            {"w1", WorkerState::kFree, cpu_only},
                                            {"w2", WorkerState::kFree, std::nullopt},
                                            {"w3", WorkerState::kFree, cpu_only}};
  auto plan = PlanGangs({gloo_gang, gpu}, workers);
  EXPECT_EQ(plan.decisions[0].gang, (std::vector<std::string>{"w1", "w2"}));
  EXPECT_TRUE(plan.decisions[1].gang.empty()) << "no worker said it has a GPU but w2, taken by the gang";
  // Alone, the GPU job takes the worker that said nothing.
  plan = PlanGangs({gpu}, workers);
  EXPECT_EQ(plan.decisions[0].gang, (std::vector<std::string>{"w2"}));
  // Too few able workers: told what it needs, and it holds nothing.
  workers[2].runs = cpu_only;
  plan = PlanGangs({gpu, QueuedGangJob{"small", "", 1, false, "", {}}}, workers);
  EXPECT_TRUE(plan.decisions[0].gang.empty());
  EXPECT_EQ(plan.decisions[0].waiting, "waiting: the job needs 1 worker that run cuda; 0 of the 4 registered do");
  EXPECT_EQ(plan.decisions[1].gang, (std::vector<std::string>{"w0"}));
  EXPECT_TRUE(plan.held.empty());
}

}  // namespace
}  // namespace strata::services
