#include "offload/nvme/io_backend.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "offload/nvme/aligned_buffer.h"
#include "tests/testutil/fault_io_backend.h"
#include "tests/testutil/testutil.h"

namespace strata::offload {
namespace {

using ::strata::testing::FaultIoBackend;
using ::strata::testing::TempDir;

constexpr int64_t kChunk = 64 << 10;

// Closes a test file on scope exit.
class ScopedFd {
 public:
  ScopedFd(const std::string& path, int flags) : fd_(::open(path.c_str(), flags, 0644)) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

void FillPattern(std::span<std::byte> bytes, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (std::byte& b : bytes) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
}

AlignedBuffer MakeBuffer(size_t size) {
  auto buffer = AlignedBuffer::Allocate(RoundUpTo(std::max<size_t>(size, 1), kDirectIoAlignment));
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  return *std::move(buffer);
}

IoEngineOptions Options(IoEngineKind kind) {
  IoEngineOptions options;
  options.kind = kind;
  options.queue_depth = 8;
  options.chunk_size = kChunk;
  return options;
}

std::unique_ptr<IoEngine> MakeEngine(IoEngineKind kind) {
  auto engine = IoEngine::Create(Options(kind));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// An engine over a fault-injecting wrapper of the posix backend (buffered
// files, so remainders of short transfers need no alignment).
std::unique_ptr<IoEngine> MakeFaultEngine(FaultIoBackend** fault, int max_retries = 64) {
  IoEngineOptions options = Options(IoEngineKind::kPosix);
  options.max_retries = max_retries;
  auto inner = CreatePosixBackend(options);
  EXPECT_TRUE(inner.ok()) << inner.status();
  auto wrapper = std::make_unique<FaultIoBackend>(*std::move(inner));
  *fault = wrapper.get();
  auto engine = IoEngine::Create(options, std::move(wrapper));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

IoRequest Request(IoOp op, int fd, int64_t offset, std::byte* buffer, int64_t length, const std::string& path) {
  IoRequest r;
  r.op = op;
  r.file = fd;
  r.offset = offset;
  r.buffer = buffer;
  r.length = length;
  r.path = path;
  return r;
}

// Writes then reads back each size at a block-aligned offset of one file.
void ExpectRoundTrips(IoEngine& engine, const std::string& path, int flags, const std::vector<int64_t>& sizes) {
  ScopedFd fd(path, O_RDWR | O_CREAT | O_CLOEXEC | flags);
  ASSERT_GE(fd.get(), 0) << path << ": " << std::strerror(errno);
  int64_t offset = 0;
  for (const int64_t size : sizes) {
    SCOPED_TRACE(size);
    AlignedBuffer out = MakeBuffer(static_cast<size_t>(size));
    AlignedBuffer in = MakeBuffer(static_cast<size_t>(size));
    FillPattern(out.span().first(static_cast<size_t>(size)), static_cast<uint32_t>(size));
    const IoRequest write = Request(IoOp::kWrite, fd.get(), offset, out.data(), size, path);
    ASSERT_TRUE(engine.Run({&write, 1}).ok());
    const IoRequest read = Request(IoOp::kRead, fd.get(), offset, in.data(), size, path);
    const absl::Status status = engine.Run({&read, 1});
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(std::memcmp(out.data(), in.data(), static_cast<size_t>(size)), 0);
    offset += static_cast<int64_t>(RoundUpTo(static_cast<size_t>(size), kDirectIoAlignment));
  }
}

const std::vector<int64_t> kOddSizes = {1, 4095, 4096, (1 << 20) + 13, (3 << 20) + 7};
const std::vector<int64_t> kAlignedSizes = {4096, kChunk, (1 << 20) + 3 * 4096, 5 << 20};

TEST(IoEngineTest, PosixRoundTripsBufferedAndDirect) {
  TempDir dir;
  auto engine = MakeEngine(IoEngineKind::kPosix);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->backend_name(), "posix");
  ExpectRoundTrips(*engine, dir.Join("buffered"), 0, kOddSizes);
  ExpectRoundTrips(*engine, dir.Join("direct"), O_DIRECT, kAlignedSizes);
}

TEST(IoEngineTest, UringRoundTripsBufferedAndDirect) {
  if (auto probe = ProbeUring(); !probe.ok()) GTEST_SKIP() << "kernel refuses io_uring: " << probe;
  TempDir dir;
  auto engine = MakeEngine(IoEngineKind::kUring);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->backend_name(), "io_uring");
  ExpectRoundTrips(*engine, dir.Join("buffered"), 0, kOddSizes);
  ExpectRoundTrips(*engine, dir.Join("direct"), O_DIRECT, kAlignedSizes);
}

TEST(IoEngineTest, AutoPicksUringWhereTheKernelAllowsIt) {
  auto engine = MakeEngine(IoEngineKind::kAuto);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->backend_name(), ProbeUring().ok() ? "io_uring" : "posix");
}

// A 4 MiB transfer in 64 KiB chunks is 64 operations, queue_depth at a time.
void ExpectChunkedAndQueueFull(IoEngineKind kind) {
  TempDir dir;
  auto engine = MakeEngine(kind);
  ASSERT_NE(engine, nullptr);
  const std::string path = dir.Join("f");
  ScopedFd fd(path, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT);
  ASSERT_GE(fd.get(), 0);
  AlignedBuffer data = MakeBuffer(4 << 20);
  FillPattern(data.span(), 7);
  const IoRequest write = Request(IoOp::kWrite, fd.get(), 0, data.data(), 4 << 20, path);
  ASSERT_TRUE(engine->Run({&write, 1}).ok());
  EXPECT_EQ(engine->stats().ops_issued, (4 << 20) / kChunk);
  EXPECT_EQ(engine->stats().max_in_flight, 8);
  EXPECT_EQ(engine->stats().bytes, 4 << 20);
}

TEST(IoEngineTest, SplitsLargeTransfersAndKeepsQueueFullPosix) { ExpectChunkedAndQueueFull(IoEngineKind::kPosix); }

TEST(IoEngineTest, SplitsLargeTransfersAndKeepsQueueFullUring) {
  if (auto probe = ProbeUring(); !probe.ok()) GTEST_SKIP() << "kernel refuses io_uring: " << probe;
  ExpectChunkedAndQueueFull(IoEngineKind::kUring);
}

TEST(IoEngineTest, ShortReadIsResubmitted) {
  TempDir dir;
  FaultIoBackend* fault = nullptr;
  auto engine = MakeFaultEngine(&fault);
  const std::string path = dir.Join("f");
  ScopedFd fd(path, O_RDWR | O_CREAT | O_CLOEXEC);
  const int64_t size = (1 << 20) + 13;
  AlignedBuffer out = MakeBuffer(size);
  AlignedBuffer in = MakeBuffer(size);
  FillPattern(out.span().first(size), 3);
  const IoRequest write = Request(IoOp::kWrite, fd.get(), 0, out.data(), size, path);
  ASSERT_TRUE(engine->Run({&write, 1}).ok());
  // Every read op reports only a third of what it got (at least one byte):
  // the engine must keep asking for the rest.
  fault->set_on_complete([](const IoBackendOp& op, int64_t res) -> int64_t {
    return op.op == IoOp::kRead && res > 1 ? std::max<int64_t>(1, res / 3) : res;
  });
  const IoRequest read = Request(IoOp::kRead, fd.get(), 0, in.data(), size, path);
  const absl::Status status = engine->Run({&read, 1});
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(std::memcmp(out.data(), in.data(), size), 0);
  EXPECT_GT(engine->stats().short_resubmits, (size + kChunk - 1) / kChunk);
  EXPECT_GT(fault->faults(), 0);
}

TEST(IoEngineTest, ShortWriteIsResubmitted) {
  TempDir dir;
  FaultIoBackend* fault = nullptr;
  auto engine = MakeFaultEngine(&fault);
  const std::string path = dir.Join("f");
  ScopedFd fd(path, O_RDWR | O_CREAT | O_CLOEXEC);
  const int64_t size = 300000;
  AlignedBuffer out = MakeBuffer(size);
  AlignedBuffer in = MakeBuffer(size);
  FillPattern(out.span().first(size), 4);
  // The kernel wrote everything, but says it wrote half: rewriting the rest
  // must still leave the right bytes.
  fault->set_on_complete([](const IoBackendOp& op, int64_t res) -> int64_t {
    return op.op == IoOp::kWrite && res > 1 ? std::max<int64_t>(1, res / 2) : res;
  });
  const IoRequest write = Request(IoOp::kWrite, fd.get(), 0, out.data(), size, path);
  ASSERT_TRUE(engine->Run({&write, 1}).ok());
  EXPECT_GT(engine->stats().short_resubmits, 0);
  fault->set_on_complete(nullptr);
  const IoRequest read = Request(IoOp::kRead, fd.get(), 0, in.data(), size, path);
  ASSERT_TRUE(engine->Run({&read, 1}).ok());
  EXPECT_EQ(std::memcmp(out.data(), in.data(), size), 0);
}

TEST(IoEngineTest, EagainOnceIsResubmitted) {
  TempDir dir;
  FaultIoBackend* fault = nullptr;
  auto engine = MakeFaultEngine(&fault);
  const std::string path = dir.Join("f");
  ScopedFd fd(path, O_RDWR | O_CREAT | O_CLOEXEC);
  AlignedBuffer out = MakeBuffer(4 * kChunk);
  AlignedBuffer in = MakeBuffer(4 * kChunk);
  FillPattern(out.span(), 5);
  bool refused = false;
  fault->set_on_issue([&refused](const IoBackendOp& op) -> std::optional<int64_t> {
    if (op.op == IoOp::kRead && !refused) {
      refused = true;
      return -EAGAIN;
    }
    return std::nullopt;
  });
  const IoRequest write = Request(IoOp::kWrite, fd.get(), 0, out.data(), 4 * kChunk, path);
  ASSERT_TRUE(engine->Run({&write, 1}).ok());
  const IoRequest read = Request(IoOp::kRead, fd.get(), 0, in.data(), 4 * kChunk, path);
  const absl::Status status = engine->Run({&read, 1});
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(refused);
  EXPECT_EQ(engine->stats().retry_resubmits, 1);
  EXPECT_EQ(fault->ops_issued(), 4 + 4 + 1);
  EXPECT_EQ(std::memcmp(out.data(), in.data(), 4 * kChunk), 0);
}

TEST(IoEngineTest, EndlessEagainFailsInsteadOfHanging) {
  TempDir dir;
  FaultIoBackend* fault = nullptr;
  auto engine = MakeFaultEngine(&fault, /*max_retries=*/3);
  const std::string path = dir.Join("f");
  ScopedFd fd(path, O_RDWR | O_CREAT | O_CLOEXEC);
  fault->set_on_issue([](const IoBackendOp&) -> std::optional<int64_t> { return -EAGAIN; });
  AlignedBuffer out = MakeBuffer(4096);
  const IoRequest write = Request(IoOp::kWrite, fd.get(), 0, out.data(), 4096, path);
  const absl::Status status = engine->Run({&write, 1});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find(path), std::string::npos) << status;
  EXPECT_EQ(fault->ops_issued(), 4);
}

TEST(IoEngineTest, ErrorNamesFileAndOffset) {
  TempDir dir;
  FaultIoBackend* fault = nullptr;
  auto engine = MakeFaultEngine(&fault);
  const std::string path = dir.Join("tensor.slot");
  ScopedFd fd(path, O_RDWR | O_CREAT | O_CLOEXEC);
  fault->set_on_issue([](const IoBackendOp& op) -> std::optional<int64_t> {
    if (op.offset == 2 * kChunk) return -ENOSPC;
    return std::nullopt;
  });
  AlignedBuffer out = MakeBuffer(4 * kChunk);
  const IoRequest write = Request(IoOp::kWrite, fd.get(), 0, out.data(), 4 * kChunk, path);
  const absl::Status status = engine->Run({&write, 1});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find(path), std::string::npos) << status;
  EXPECT_NE(status.message().find(absl::StrCat("offset ", 2 * kChunk)), std::string::npos) << status;
  EXPECT_EQ(engine->pending(), 0);
}

TEST(IoEngineTest, ReadPastEndOfFileIsOutOfRange) {
  TempDir dir;
  auto engine = MakeEngine(IoEngineKind::kPosix);
  const std::string path = dir.Join("short");
  testing::WriteTextFile(path, std::string(4096, 'x'));
  ScopedFd fd(path, O_RDONLY | O_CLOEXEC);
  AlignedBuffer in = MakeBuffer(8192);
  const IoRequest read = Request(IoOp::kRead, fd.get(), 0, in.data(), 8192, path);
  const absl::Status status = engine->Run({&read, 1});
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  EXPECT_NE(status.message().find(path), std::string::npos) << status;
}

TEST(IoEngineTest, ManyTransfersCompleteWithTheirTags) {
  TempDir dir;
  auto engine = MakeEngine(IoEngineKind::kAuto);
  const std::string path = dir.Join("f");
  ScopedFd fd(path, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT);
  constexpr int kTransfers = 20;
  AlignedBuffer out = MakeBuffer(kTransfers * 3 * kChunk);
  FillPattern(out.span(), 11);
  std::vector<IoRequest> writes;
  for (int i = 0; i < kTransfers; ++i) {
    writes.push_back(Request(IoOp::kWrite, fd.get(), i * 3 * kChunk, out.data() + i * 3 * kChunk, 3 * kChunk, path));
    writes.back().tag = 1000 + i;
  }
  ASSERT_TRUE(engine->Submit(writes).ok());
  std::vector<IoCompletion> done;
  ASSERT_TRUE(engine->Wait(kTransfers, &done).ok());
  ASSERT_EQ(done.size(), static_cast<size_t>(kTransfers));
  std::vector<bool> seen(kTransfers, false);
  for (const IoCompletion& c : done) {
    EXPECT_TRUE(c.status.ok()) << c.status;
    ASSERT_GE(c.tag, 1000u);
    seen[c.tag - 1000] = true;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), kTransfers);
  EXPECT_EQ(engine->pending(), 0);
}

void ExpectFixedFilesAndBuffersRoundTrip(IoEngineKind kind) {
  TempDir dir;
  auto engine = MakeEngine(kind);
  ASSERT_NE(engine, nullptr);
  const std::string path = dir.Join("f");
  ScopedFd fd(path, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT);
  auto index = engine->RegisterFile(fd.get());
  ASSERT_TRUE(index.ok()) << index.status();
  AlignedBuffer arena = MakeBuffer(8 * kChunk);
  const std::span<std::byte> region = arena.span();
  ASSERT_TRUE(engine->RegisterBuffers({&region, 1}).ok());
  FillPattern(arena.span().first(4 * kChunk), 13);
  IoRequest write = Request(IoOp::kWrite, *index, 0, arena.data(), 4 * kChunk, path);
  write.fixed_file = true;
  ASSERT_TRUE(engine->Run({&write, 1}).ok());
  IoRequest read = Request(IoOp::kRead, *index, 0, arena.data() + 4 * kChunk, 4 * kChunk, path);
  read.fixed_file = true;
  const absl::Status status = engine->Run({&read, 1});
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(std::memcmp(arena.data(), arena.data() + 4 * kChunk, 4 * kChunk), 0);
  EXPECT_EQ(engine->stats().fixed_buffer_ops, 8);
  EXPECT_EQ(engine->stats().fixed_file_ops, 8);
  EXPECT_TRUE(engine->UnregisterFile(*index).ok());
  EXPECT_TRUE(engine->RegisterBuffers({}).ok());
}

TEST(IoEngineTest, FixedFilesAndBuffersUring) {
  if (auto probe = ProbeUring(); !probe.ok()) GTEST_SKIP() << "kernel refuses io_uring: " << probe;
  ExpectFixedFilesAndBuffersRoundTrip(IoEngineKind::kUring);
}

TEST(IoEngineTest, FixedFilesAndBuffersPosix) { ExpectFixedFilesAndBuffersRoundTrip(IoEngineKind::kPosix); }

TEST(IoEngineTest, ZeroLengthTransferCompletes) {
  auto engine = MakeEngine(IoEngineKind::kPosix);
  IoRequest empty;
  empty.file = 0;
  empty.tag = 42;
  ASSERT_TRUE(engine->Submit(empty).ok());
  std::vector<IoCompletion> done;
  ASSERT_TRUE(engine->Wait(1, &done).ok());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tag, 42u);
  EXPECT_TRUE(done[0].status.ok());
}

TEST(IoEngineTest, InvalidOptionsAndRequestsAreRejected) {
  IoEngineOptions options;
  options.chunk_size = 1000;
  EXPECT_EQ(IoEngine::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = IoEngineOptions();
  options.queue_depth = 0;
  EXPECT_EQ(IoEngine::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseIoEngineKind("spdk").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseIoEngineKind("io_uring"), IoEngineKind::kUring);

  auto engine = MakeEngine(IoEngineKind::kPosix);
  IoRequest bad;
  bad.file = 0;
  bad.length = 10;  // null buffer
  EXPECT_EQ(engine->Submit(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->pending(), 0);
}

}  // namespace
}  // namespace strata::offload
