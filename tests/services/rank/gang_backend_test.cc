// Which c10d backend a job's gang uses: parallel.backend against
// memory.device and what this build has.
#include "gtest/gtest.h"
#include "offload/tiers/placement.h"
#include "services/rank/local_gang.h"

namespace strata::services {
namespace {

policies::JobSpec Spec(const std::string& device, const std::string& backend) {
  policies::JobSpec spec;
  spec.memory.device = device;
  spec.memory.device_index = *offload::ParseDeviceName(device);
  spec.parallel.backend = backend;
  return spec;
}

TEST(GangBackendTest, AutoIsGlooOnTheCpuAndBuildsNoGroupForOneRank) {
  auto chosen = ChooseGangBackend(Spec("cpu", "auto"));
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->backend, policies::Backend::kGloo);
  EXPECT_FALSE(chosen->group_of_one);
}

TEST(GangBackendTest, AutoOnAGpuIsNcclWhereTheBuildHasIt) {
  auto chosen = ChooseGangBackend(Spec("cuda:1", "auto"));
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->backend, policies::ProcessGroup::Available(policies::Backend::kNccl) ? policies::Backend::kNccl
                                                                                         : policies::Backend::kGloo);
  EXPECT_EQ(chosen->device_index, 1);
}

TEST(GangBackendTest, ANamedBackendBuildsAGroupEvenForOneRank) {
  auto gloo = ChooseGangBackend(Spec("cpu", "gloo"));
  if (policies::ProcessGroup::Available(policies::Backend::kGloo)) {
    ASSERT_TRUE(gloo.ok()) << gloo.status();
    EXPECT_TRUE(gloo->group_of_one);
  }
  auto nccl = ChooseGangBackend(Spec("cuda", "nccl"));
  if (policies::ProcessGroup::Available(policies::Backend::kNccl)) {
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    EXPECT_EQ(nccl->backend, policies::Backend::kNccl);
    EXPECT_TRUE(nccl->group_of_one);
  } else {
    EXPECT_EQ(nccl.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(nccl.status().message().find("parallel.backend"), std::string::npos) << nccl.status();
  }
}

}  // namespace
}  // namespace strata::services
