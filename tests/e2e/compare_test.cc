// `strata compare RUN... --plot FILE`: the table, and a picture of the runs.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

// A run of `iterations` lines whose KL grows at `kl_slope` per iteration.
void WriteRun(const std::string& dir, int iterations, double kl_slope) {
  std::string lines;
  for (int i = 0; i < iterations; ++i) {
    lines += absl::StrCat(R"({"iteration":)", i, R"(,"objective/kl":)", kl_slope * i,
                          i % 3 == 0 ? absl::StrCat(R"(,"eval/score":)", 0.1 * i) : "",
                          R"(,"time/iteration_s":0.5,"time/rollout_s":0.2,"time/score_s":0.1,"time/update_s":0.2,)",
                          R"("memory/device_peak_bytes":52428800,"memory/host_peak_bytes":)", 10485760 * (1 + kl_slope),
                          R"(,"memory/nvme_peak_bytes":0})", "\n");
  }
  std::filesystem::create_directories(dir);
  testing::WriteTextFile(JoinPath(dir, "metrics.jsonl"), lines);
}

testing::CommandResult Strata(std::vector<std::string> args) {
  args.insert(args.begin(), testing::StrataBinary());
  auto result = testing::RunCommand(args);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : testing::CommandResult{};
}

uint32_t BigEndian32(const std::string& s, size_t at) {
  return (uint32_t{static_cast<uint8_t>(s[at])} << 24) | (uint32_t{static_cast<uint8_t>(s[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(s[at + 3])};
}

TEST(CompareTest, PlotDrawsTheRunsAsAPngOrSvg) {
  testing::TempDir dir;
  WriteRun(dir.Join("remax"), 10, 1.0);
  WriteRun(dir.Join("ppo"), 10, 0.5);
  auto table = Strata({"compare", dir.Join("remax"), dir.Join("ppo"), "--plot", dir.Join("runs.png")});
#if !STRATA_WITH_PLOT
  // A build without cairo (-DSTRATA_WITH_PLOT=OFF, the GPU machine's) says
  // so, naming the flag, and writes nothing.
  EXPECT_NE(table.exit_code, 0);
  EXPECT_NE(table.error.find("STRATA_WITH_PLOT=OFF"), std::string::npos) << table.error;
  EXPECT_FALSE(IsRegularFile(dir.Join("runs.png")));
  GTEST_SKIP() << "this build has no --plot (STRATA_WITH_PLOT=OFF); checked that it says so";
#endif
  ASSERT_EQ(table.exit_code, 0) << table.error;
  EXPECT_NE(table.output.find("eval score (last)"), std::string::npos);  // the table still prints

  auto png = ReadFileToString(dir.Join("runs.png"));
  ASSERT_TRUE(png.ok()) << png.status();
  ASSERT_GT(png->size(), 24u);
  EXPECT_EQ(png->substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(png->substr(12, 4), "IHDR");
  EXPECT_EQ(BigEndian32(*png, 16), 1280u);
  EXPECT_EQ(BigEndian32(*png, 20), 840u);

  // The picture follows the data: the same runs draw the same bytes, other
  // runs another picture.
  ASSERT_EQ(Strata({"compare", dir.Join("remax"), dir.Join("ppo"), "--plot", dir.Join("again.png")}).exit_code, 0);
  EXPECT_EQ(*ReadFileToString(dir.Join("again.png")), *png);
  WriteRun(dir.Join("ppo"), 10, 2.0);
  ASSERT_EQ(Strata({"compare", dir.Join("remax"), dir.Join("ppo"), "--plot", dir.Join("other.png")}).exit_code, 0);
  EXPECT_NE(*ReadFileToString(dir.Join("other.png")), *png);

  ASSERT_EQ(Strata({"compare", dir.Join("remax"), "--plot", dir.Join("runs.svg")}).exit_code, 0);
  auto svg = ReadFileToString(dir.Join("runs.svg"));
  ASSERT_TRUE(svg.ok());
  EXPECT_NE(svg->find("<svg"), std::string::npos);
  EXPECT_NE(svg->find("viewBox=\"0 0 1280 840\""), std::string::npos);
}

// Each verifier's accuracy (first and last evaluation) and each reward
// source's time get a row; eval/initial_* (a continuation's copy of its
// first evaluation) does not.
TEST(CompareTest, TheTableHasEachAccuracyAndEachRewardSourcesTime) {
  testing::TempDir dir;
  std::string lines;
  for (int i = 0; i < 4; ++i) {
    lines += absl::StrCat(R"({"iteration":)", i, R"(,"time/iteration_s":1,"time/score/server_s":0.25)",
                          i == 0 ? R"(,"eval/math/accuracy":0.2,"eval/initial_math/accuracy":0.2)" : "",
                          i == 3 ? R"(,"eval/math/accuracy":0.5)" : "", "}\n");
  }
  std::filesystem::create_directories(dir.Join("grpo"));
  testing::WriteTextFile(dir.Join("grpo/metrics.jsonl"), lines);
  auto table = Strata({"compare", dir.Join("grpo")});
  ASSERT_EQ(table.exit_code, 0) << table.error;
  auto row = [&](const std::string& label) {
    const size_t at = table.output.find(label);
    if (at == std::string::npos) return std::string("(no row)");
    const size_t end = table.output.find('\n', at);
    return std::string(absl::StripAsciiWhitespace(table.output.substr(at + label.size(), end - at - label.size())));
  };
  EXPECT_EQ(row("math/accuracy (first)"), "0.200") << table.output;
  EXPECT_EQ(row("math/accuracy (last)"), "0.500") << table.output;
  EXPECT_EQ(row("reward server s"), "0.250") << table.output;
  EXPECT_EQ(table.output.find("initial"), std::string::npos) << table.output;
}

TEST(CompareTest, APlotThatCannotBeWrittenFailsNamingTheFile) {
  testing::TempDir dir;
  WriteRun(dir.Join("run"), 3, 1.0);
  const std::string target = dir.Join("missing/dir/runs.png");
  auto result = Strata({"compare", dir.Join("run"), "--plot", target});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.error.find(target), std::string::npos) << result.error;
}

}  // namespace
}  // namespace strata
