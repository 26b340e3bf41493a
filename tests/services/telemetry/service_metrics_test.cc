#include "services/telemetry/service_metrics.h"

#include "gtest/gtest.h"

namespace strata::services {
namespace {

TEST(ServiceMetricsTest, AMalformedAddressIsRefusedNamingTheFlag) {
  ServiceMetrics& metrics = ServiceMetrics::Global();
  for (const char* bad : {"9400", ":9400", "localhost:http", "localhost:70000", "host:-1"}) {
    const absl::Status status = metrics.Serve(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("--metrics-listen"), std::string::npos) << status;
  }
  EXPECT_EQ(metrics.port(), 0);
}

}  // namespace
}  // namespace strata::services
