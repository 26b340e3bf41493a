#include "services/telemetry/tensorboard_writer.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/file.h"
#include "gtest/gtest.h"
#include "services/telemetry/crc32c.h"
#include "services/telemetry/tensorboard_event.pb.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path().string());
  }
  return files;
}

// Splits a file into its records, checking both CRCs of each.
std::vector<tensorboard::Event> ReadEvents(const std::string& path) {
  auto data = ReadFileToString(path);
  EXPECT_TRUE(data.ok());
  std::vector<tensorboard::Event> events;
  size_t pos = 0;
  while (data.ok() && pos < data->size()) {
    uint64_t length = 0;
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length, data->data() + pos, 8);
    std::memcpy(&length_crc, data->data() + pos + 8, 4);
    EXPECT_EQ(length_crc, MaskedCrc32c(std::string_view(data->data() + pos, 8)));
    const std::string payload = data->substr(pos + 12, length);
    std::memcpy(&data_crc, data->data() + pos + 12 + length, 4);
    EXPECT_EQ(data_crc, MaskedCrc32c(payload));
    tensorboard::Event event;
    EXPECT_TRUE(event.ParseFromString(payload));
    events.push_back(event);
    pos += 16 + length;
  }
  return events;
}

TEST(TensorBoardWriterTest, WritesAVersionEventThenOneEventPerStep) {
  testing::TempDir dir;
  auto writer = TensorBoardWriter::Open(dir.Join("tb"), /*fresh=*/true);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->WriteScalars(0, {{"eval/score", 0.25}, {"objective/kl", 1.5}}, 100.0).ok());
  ASSERT_TRUE((*writer)->WriteScalars(1, {{"eval/score", 0.5}}, 101.0).ok());
  const auto files = EventFiles(dir.Join("tb"));
  ASSERT_EQ(files.size(), 1u);
  const auto events = ReadEvents(files[0]);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].step(), 0);
  EXPECT_EQ(events[1].wall_time(), 100.0);
  ASSERT_EQ(events[1].summary().value_size(), 2);
  EXPECT_EQ(events[1].summary().value(0).tag(), "eval/score");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 0.25f);
  EXPECT_EQ(events[1].summary().value(1).tag(), "objective/kl");
  EXPECT_EQ(events[2].step(), 1);
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 0.5f);
}

TEST(TensorBoardWriterTest, FreshStartRemovesOldEventFilesAndAResumeKeepsThem) {
  testing::TempDir dir;
  const std::string tb = dir.Join("tb");
  { ASSERT_TRUE(TensorBoardWriter::Open(tb, true).ok()); }
  testing::WriteTextFile(JoinPath(tb, "notes.txt"), "mine");
  { ASSERT_TRUE(TensorBoardWriter::Open(tb, /*fresh=*/false).ok()); }
  EXPECT_EQ(EventFiles(tb).size(), 2u);
  { ASSERT_TRUE(TensorBoardWriter::Open(tb, /*fresh=*/true).ok()); }
  EXPECT_EQ(EventFiles(tb).size(), 1u);
  EXPECT_TRUE(IsRegularFile(JoinPath(tb, "notes.txt")));  // only event files go
}

TEST(TensorBoardWriterTest, ADirectoryThatCannotBeMadeIsAnErrorNamingIt) {
  testing::TempDir dir;
  testing::WriteTextFile(dir.Join("file"), "x");
  auto writer = TensorBoardWriter::Open(dir.Join("file/tb"), true);
  ASSERT_FALSE(writer.ok());
  EXPECT_NE(writer.status().message().find(dir.Join("file/tb")), std::string::npos) << writer.status();
}

}  // namespace
}  // namespace strata::services
