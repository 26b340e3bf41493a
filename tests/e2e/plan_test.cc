// `strata plan` as the CLI runs it (RunPlan), on Llama-2-7B's shape.
#include "services/cli/plan_command.h"

#include "base/file.h"
#include "gtest/gtest.h"
#include "policies/job/job_spec.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = dir_.Join("remax.yaml");
    const std::string model = testing::SourcePath("examples/llama2-7b");
    ASSERT_TRUE(WriteFileAtomically(spec_, "algorithm: remax\nmodels:\n  actor: {path: " + model +
                                               ", dtype: bf16}\n  reference: {path: " + model +
                                               ", dtype: bf16}\n  reward: {path: " + model +
                                               ", dtype: bf16}\ndata: {train: prompts.jsonl}\n"
                                               "train: {batch_size: 16}\noutput: {dir: out}\n")
                    .ok());
  }
  testing::TempDir dir_;
  std::string spec_;
};

// --workers plans the spec as if it said so: a fit is written with it, so
// that the spec that runs is the one that was planned.
TEST_F(PlanTest, AFitForSeveralWorkersIsWrittenWithThem) {
  PlanOptions options;
  options.specs = {spec_};
  options.fit = "device=80GiB,host=512GiB";
  options.workers = 4;
  options.write = dir_.Join("fit.yaml");
  auto text = RunPlan(options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("4 workers"), std::string::npos) << *text;
  auto written = ReadFileToString(options.write);
  ASSERT_TRUE(written.ok()) << written.status();
  auto spec = policies::ParseJobSpec(*written, {}, options.write);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel.workers, 4);
}

// ...and refused as `train` would refuse it, naming the key.
TEST_F(PlanTest, WorkersTheSpecCannotRunAreRefusedNamingTheKey) {
  PlanOptions options;
  options.specs = {spec_};
  options.workers = 32;  // more ranks than the batch's 16 rows
  auto text = RunPlan(options);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
  EXPECT_NE(text.status().message().find("parallel.workers"), absl::string_view::npos) << text.status();
}

}  // namespace
}  // namespace strata::services
