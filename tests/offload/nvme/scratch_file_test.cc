#include "offload/nvme/scratch_file.h"

#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "offload/nvme/aligned_buffer.h"
#include "offload/nvme/io_backend.h"
#include "tests/testutil/fault_io_backend.h"
#include "tests/testutil/testutil.h"

namespace strata::offload {
namespace {

using ::strata::testing::FaultIoBackend;

int64_t EntriesIn(const std::string& dir) {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

AlignedBuffer Random(size_t bytes, uint32_t seed) {
  AlignedBuffer buffer = *AlignedBuffer::Allocate(bytes);
  std::mt19937 gen(seed);
  for (size_t i = 0; i < bytes; ++i) buffer.data()[i] = static_cast<std::byte>(gen());
  return buffer;
}

ScratchFileOptions Options(const std::string& dir, int64_t slot_bytes, int64_t slots) {
  ScratchFileOptions options;
  options.directory = dir;
  options.slot_bytes = slot_bytes;
  options.slots = slots;
  options.queue_depth = 4;
  return options;
}

TEST(ScratchFileTest, SlotsReadBackWhatWasWrittenAndTheDirectoryStaysEmpty) {
  testing::TempDir dir;
  const int64_t slot = 5 * 4096 + 100;  // rounded up to whole blocks
  auto file = ScratchFile::Create(Options(dir.path(), slot, 3));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->slot_bytes(), 6 * 4096);
  std::vector<AlignedBuffer> written;
  std::vector<ScratchFile::Ticket> tickets;
  for (int i = 0; i < 3; ++i) {
    written.push_back(Random(6 * 4096, static_cast<uint32_t>(i)));
    auto ticket = (*file)->StartWrite(i, written.back().span());
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    tickets.push_back(*ticket);
  }
  for (auto t : tickets) ASSERT_TRUE((*file)->Wait(t).ok());
  // Unnamed: nothing in the directory while it is open.
  EXPECT_EQ(EntriesIn(dir.path()), 0);
  for (int i = 2; i >= 0; --i) {
    AlignedBuffer back = *AlignedBuffer::Allocate(6 * 4096);
    auto ticket = (*file)->StartRead(i, back.span());
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    ASSERT_TRUE((*file)->Wait(*ticket).ok());
    EXPECT_EQ(std::memcmp(back.data(), written[static_cast<size_t>(i)].data(), back.size()), 0) << "slot " << i;
  }
}

TEST(ScratchFileTest, RefusesWhatODirectCannotTakeAndUnknownSlots) {
  testing::TempDir dir;
  auto file = ScratchFile::Create(Options(dir.path(), 8192, 2));
  ASSERT_TRUE(file.ok()) << file.status();
  AlignedBuffer buffer = *AlignedBuffer::Allocate(3 * 4096);
  EXPECT_EQ((*file)->StartWrite(2, buffer.span().first(4096)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*file)->StartWrite(0, buffer.span().first(100)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*file)->StartWrite(0, buffer.span().subspan(8, 4096)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*file)->StartRead(0, buffer.span()).status().code(), absl::StatusCode::kInvalidArgument);  // > slot
  EXPECT_EQ(ScratchFile::Create(Options(dir.path() + "/missing", 4096, 1)).status().code(),
            absl::StatusCode::kNotFound);
}

// A disk that cannot hold the slots fails at Create, naming the directory,
// not in the middle of a training step.
TEST(ScratchFileTest, AFullDiskFailsAtCreateNamingTheDirectory) {
  testing::TempDir dir;
  struct statvfs fs;
  ASSERT_EQ(::statvfs(dir.path().c_str(), &fs), 0);
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  const int64_t slot = int64_t{1} << 30;
  auto file = ScratchFile::Create(Options(dir.path(), slot, free_bytes / slot + 2));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kResourceExhausted) << file.status();
  EXPECT_NE(file.status().message().find(dir.path()), std::string::npos) << file.status();
  EXPECT_EQ(EntriesIn(dir.path()), 0);
}

TEST(ScratchFileTest, AWriteErrorNamesTheFileAndSlot) {
  testing::TempDir dir;
  IoEngineOptions engine_options;
  engine_options.kind = IoEngineKind::kPosix;
  engine_options.queue_depth = 2;
  engine_options.chunk_size = 4096;
  auto inner = CreatePosixBackend(engine_options);
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto fault = std::make_unique<FaultIoBackend>(*std::move(inner));
  fault->set_on_issue([](const IoBackendOp& op) -> std::optional<int64_t> {
    if (op.op == IoOp::kWrite && op.offset >= 8192) return -ENOSPC;
    return std::nullopt;
  });
  auto engine = IoEngine::Create(engine_options, std::move(fault));
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto file = ScratchFile::Create(Options(dir.path(), 8192, 2), *std::move(engine));
  ASSERT_TRUE(file.ok()) << file.status();
  AlignedBuffer buffer = Random(8192, 7);
  ASSERT_TRUE((*file)->Wait(*(*file)->StartWrite(0, buffer.span())).ok());
  const absl::Status failed = (*file)->Wait(*(*file)->StartWrite(1, buffer.span()));
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
  EXPECT_NE(failed.message().find("slot 1"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find(dir.path()), std::string::npos) << failed;
}

// A process killed with -9 while holding a scratch file leaves nothing in
// the directory: the file never had a name.
TEST(ScratchFileTest, AKilledProcessLeavesNoFile) {
  testing::TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto file = ScratchFile::Create(Options(dir.path(), 1 << 20, 4));
    if (file.ok()) {
      AlignedBuffer buffer = Random(1 << 20, 3);
      auto ticket = (*file)->StartWrite(1, buffer.span());
      if (ticket.ok() && (*file)->Wait(*ticket).ok()) (void)!::write(ready[1], "k", 1);
    }
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the child could not write its scratch file";
  ::close(ready[0]);
  EXPECT_EQ(EntriesIn(dir.path()), 0);
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(EntriesIn(dir.path()), 0);
}

}  // namespace
}  // namespace strata::offload
