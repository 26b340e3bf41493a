#include "offload/nvme_store.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "offload/aligned_buffer.h"
#include "offload/file.h"
#include "offload/io_engine.h"
#include "tests/testutil/fault_io_backend.h"
#include "tests/testutil/testutil.h"

namespace strata::offload {
namespace {

using ::strata::testing::FaultIoBackend;
using ::strata::testing::TempDir;

constexpr int64_t kBlock = 256 << 10;
const std::vector<int64_t> kSizes = {0, 1, 4095, 4096, (1 << 20) + 13, (5 << 20) + 7};

std::vector<std::byte> Pattern(int64_t size, uint32_t seed) {
  std::vector<std::byte> bytes(static_cast<size_t>(size));
  uint32_t x = seed * 2654435761u + 7;
  for (std::byte& b : bytes) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return bytes;
}

NvmeStoreOptions Options(const std::string& dir, IoEngineKind kind = IoEngineKind::kAuto) {
  NvmeStoreOptions options;
  options.directory = dir;
  options.block_size = kBlock;
  options.queue_depth = 8;
  options.engine = kind;
  return options;
}

std::unique_ptr<NvmeStore> OpenStore(const NvmeStoreOptions& options) {
  auto store = NvmeStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// A store whose engine runs over a fault-injecting posix backend.
std::unique_ptr<NvmeStore> OpenFaultStore(const NvmeStoreOptions& options,
                                          FaultIoBackend** fault) {
  IoEngineOptions engine_options;
  engine_options.kind = IoEngineKind::kPosix;
  engine_options.queue_depth = options.queue_depth;
  engine_options.chunk_size = options.block_size;
  auto inner = CreatePosixBackend(engine_options);
  EXPECT_TRUE(inner.ok()) << inner.status();
  auto wrapper = std::make_unique<FaultIoBackend>(*std::move(inner));
  *fault = wrapper.get();
  auto engine = IoEngine::Create(engine_options, std::move(wrapper));
  EXPECT_TRUE(engine.ok()) << engine.status();
  auto store = NvmeStore::Open(options, *std::move(engine));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// Gets `id` both into unaligned memory (fully bounced) and into an aligned
// buffer (bulk in place, tail bounced) and compares with `expected`.
void ExpectContents(NvmeStore& store, const std::string& id,
                    const std::vector<std::byte>& expected) {
  SCOPED_TRACE(id);
  const size_t size = expected.size();
  auto stored_size = store.Size(id);
  ASSERT_TRUE(stored_size.ok()) << stored_size.status();
  ASSERT_EQ(*stored_size, static_cast<int64_t>(size));
  std::vector<std::byte> backing(size + 1);
  const std::span<std::byte> unaligned(backing.data() + 1, size);
  absl::Status status = store.Get(id, unaligned);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(std::equal(unaligned.begin(), unaligned.end(), expected.begin()));
  auto aligned = AlignedBuffer::Allocate(RoundUpTo(size + 1, kDirectIoAlignment));
  ASSERT_TRUE(aligned.ok());
  status = store.Get(id, aligned->span().first(size));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(std::memcmp(aligned->data(), expected.data(), size), 0);
}

std::string SizeId(int64_t size, const std::string& kind) {
  return absl::StrCat("actor/model.layers.", size, ".mlp.up_proj.weight/", kind);
}

// Puts every size from unaligned memory and from an aligned buffer.
void PutAllSizes(NvmeStore& store) {
  for (const int64_t size : kSizes) {
    SCOPED_TRACE(size);
    const std::vector<std::byte> data = Pattern(size, static_cast<uint32_t>(size));
    std::vector<std::byte> backing(data.size() + 1);
    std::copy(data.begin(), data.end(), backing.begin() + 1);
    absl::Status status = store.Put(SizeId(size, "exp_avg"), {backing.data() + 1, data.size()});
    ASSERT_TRUE(status.ok()) << status;
    auto aligned = AlignedBuffer::Allocate(RoundUpTo(data.size() + 1, kDirectIoAlignment));
    ASSERT_TRUE(aligned.ok());
    std::copy(data.begin(), data.end(), aligned->data());
    status = store.Put(SizeId(size, "exp_avg_sq"), aligned->span().first(data.size()));
    ASSERT_TRUE(status.ok()) << status;
  }
}

void ExpectAllSizes(NvmeStore& store) {
  for (const int64_t size : kSizes) {
    const std::vector<std::byte> data = Pattern(size, static_cast<uint32_t>(size));
    ExpectContents(store, SizeId(size, "exp_avg"), data);
    ExpectContents(store, SizeId(size, "exp_avg_sq"), data);
  }
}

std::vector<std::string> SlotFiles(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 5 && name.substr(name.size() - 5) == ".slot") names.push_back(name);
  }
  return names;
}

// Mounts a filesystem for one test (root only); unmounts on scope exit.
class ScopedMount {
 public:
  ScopedMount(const std::string& target, const char* fstype, unsigned long flags,
              const char* data)
      : target_(target) {
    if (::mount(fstype, target.c_str(), fstype, flags, data) == 0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~ScopedMount() {
    if (mounted_) ::umount2(target_.c_str(), MNT_DETACH);
  }
  ScopedMount(const ScopedMount&) = delete;
  ScopedMount& operator=(const ScopedMount&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string target_;
  bool mounted_ = false;
  std::string error_;
};

TEST(NvmeStoreTest, RoundTripsManySizesPosix) {
  TempDir dir;
  auto store = OpenStore(Options(dir.path(), IoEngineKind::kPosix));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->engine().backend_name(), "posix");
  PutAllSizes(*store);
  ExpectAllSizes(*store);
}

TEST(NvmeStoreTest, RoundTripsManySizesUring) {
  if (auto probe = ProbeUring(); !probe.ok()) GTEST_SKIP() << "kernel refuses io_uring: " << probe;
  TempDir dir;
  auto store = OpenStore(Options(dir.path(), IoEngineKind::kUring));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->engine().backend_name(), "io_uring");
  PutAllSizes(*store);
  ExpectAllSizes(*store);
  // Large tensors went out in block-size pieces, several at a time.
  EXPECT_GT(store->engine().stats().max_in_flight, 1);
}

TEST(NvmeStoreTest, UsesODirectExactlyWhereTheFilesystemAllowsIt) {
  TempDir dir;
  const std::string probe = dir.Join("probe");
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  const bool filesystem_allows = fd >= 0;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->o_direct(), filesystem_allows);
}

TEST(NvmeStoreTest, DataSurvivesReopen) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    PutAllSizes(*store);
    // Overwrite one tensor with a different size: the reopened store must
    // see the last value.
    const std::vector<std::byte> v2 = Pattern(9000, 99);
    ASSERT_TRUE(store->Put(SizeId(1, "exp_avg"), v2).ok());
  }
  auto store = OpenStore(Options(dir.path(), IoEngineKind::kPosix));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Ids().size(), 2 * kSizes.size());
  ExpectContents(*store, SizeId(1, "exp_avg"), Pattern(9000, 99));
  for (const int64_t size : kSizes) {
    ExpectContents(*store, SizeId(size, "exp_avg_sq"), Pattern(size, static_cast<uint32_t>(size)));
  }
}

TEST(NvmeStoreTest, SlotFileNamesAreStableAndReadable) {
  const std::string id = "actor/model.layers.3.mlp.up_proj.weight/exp_avg";
  const std::string name = NvmeStore::SlotFileName(id);
  EXPECT_EQ(name.rfind("actor_model.layers.3.mlp.up_proj.weight_exp_avg-", 0), 0u) << name;
  EXPECT_EQ(name.substr(name.size() - 5), ".slot");
  // Ids that sanitise alike still get different files.
  EXPECT_NE(NvmeStore::SlotFileName("a/b"), NvmeStore::SlotFileName("a_b"));
  EXPECT_EQ(NvmeStore::SlotFileName("../../etc").find('/'), std::string::npos);
  // Two stores put the same id in the same file.
  TempDir a, b;
  for (const TempDir* dir : {&a, &b}) {
    auto store = OpenStore(Options(dir->path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(id, Pattern(10, 1)).ok());
    EXPECT_EQ(SlotFiles(dir->path()), std::vector<std::string>{name});
  }
}

TEST(NvmeStoreTest, AsyncBatchesOverlapAndCompleteInAnyOrder) {
  TempDir dir;
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  std::vector<std::vector<std::byte>> data;
  std::vector<NvmeWrite> writes;
  for (int i = 0; i < 4; ++i) data.push_back(Pattern((1 << 20) + i * 1000, 20 + i));
  for (int i = 0; i < 4; ++i) writes.push_back({absl::StrCat("t", i), data[i]});
  auto write = store->StartWrite(writes);
  ASSERT_TRUE(write.ok()) << write.status();
  ASSERT_TRUE(store->Wait(*write).ok());

  std::vector<std::vector<std::byte>> out(4);
  for (int i = 0; i < 4; ++i) out[i].resize(data[i].size());
  const std::vector<NvmeRead> first = {{"t0", out[0]}, {"t1", out[1]}};
  const std::vector<NvmeRead> second = {{"t2", out[2]}, {"t3", out[3]}};
  auto ticket1 = store->StartRead(first);
  auto ticket2 = store->StartRead(second);
  ASSERT_TRUE(ticket1.ok() && ticket2.ok());
  ASSERT_TRUE(store->Wait(*ticket2).ok());
  ASSERT_TRUE(store->Wait(*ticket1).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], data[i]) << i;
  EXPECT_GT(store->engine().stats().max_in_flight, 1);
  EXPECT_EQ(store->Wait(*ticket1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(NvmeStoreTest, ConflictingIoOnOneTensorIsRefused) {
  TempDir dir;
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  const std::vector<std::byte> data = Pattern(3 << 20, 5);
  auto write = store->StartWrite("w", data);
  ASSERT_TRUE(write.ok());
  std::vector<std::byte> out(data.size());
  EXPECT_EQ(store->StartRead("w", out).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->StartWrite("w", data).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Remove("w").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->Wait(*write).ok());
  ASSERT_TRUE(store->Get("w", out).ok());
  EXPECT_EQ(out, data);
  std::vector<std::byte> wrong(10);
  EXPECT_EQ(store->Get("w", wrong).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Get("absent", wrong).code(), absl::StatusCode::kNotFound);
}

TEST(NvmeStoreTest, ShortReadIsResubmitted) {
  TempDir dir;
  FaultIoBackend* fault = nullptr;
  auto store = OpenFaultStore(Options(dir.path()), &fault);
  ASSERT_NE(store, nullptr);
  const std::vector<std::byte> data = Pattern((1 << 20) + 13, 8);
  ASSERT_TRUE(store->Put("t", data).ok());
  // O_DIRECT devices come up short in whole blocks; keep the remainder
  // aligned so the resubmission is a legal O_DIRECT read.
  fault->set_on_complete([](const IoBackendOp& op, int64_t res) -> int64_t {
    if (op.op != IoOp::kRead || res < 8192) return res;
    return res / 2 / 4096 * 4096;
  });
  ExpectContents(*store, "t", data);
  EXPECT_GT(store->engine().stats().short_resubmits, 0);
}

TEST(NvmeStoreTest, EagainOnceIsResubmitted) {
  TempDir dir;
  FaultIoBackend* fault = nullptr;
  auto store = OpenFaultStore(Options(dir.path()), &fault);
  ASSERT_NE(store, nullptr);
  int refusals = 0;
  fault->set_on_issue([&refusals](const IoBackendOp&) -> std::optional<int64_t> {
    if (refusals++ == 0) return -EAGAIN;
    return std::nullopt;
  });
  const std::vector<std::byte> data = Pattern(3 * kBlock + 100, 9);
  ASSERT_TRUE(store->Put("t", data).ok());
  EXPECT_EQ(store->engine().stats().retry_resubmits, 1);
  ExpectContents(*store, "t", data);
}

TEST(NvmeStoreTest, DiskFullIsResourceExhaustedAndLeavesNothingValid) {
  TempDir dir;
  const std::string mount_point = dir.Join("tiny");
  ASSERT_EQ(::mkdir(mount_point.c_str(), 0755), 0);
  ScopedMount tiny(mount_point, "tmpfs", 0, "size=1m");
  if (!tiny.mounted()) GTEST_SKIP() << "cannot mount a 1 MiB tmpfs: " << tiny.error();
  {
    auto store = OpenStore(Options(mount_point));
    ASSERT_NE(store, nullptr);
    const absl::Status status = store->Put("big", Pattern(4 << 20, 1));
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_NE(status.message().find(mount_point), std::string::npos) << status;
    EXPECT_NE(status.message().find("big"), std::string::npos) << status;
    EXPECT_FALSE(store->Contains("big"));
    std::vector<std::byte> out(4 << 20);
    EXPECT_EQ(store->Get("big", out).code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(SlotFiles(mount_point).empty());
    // The space went back: a tensor that fits still works.
    ASSERT_TRUE(store->Put("small", Pattern(64 << 10, 2)).ok());
  }
  auto store = OpenStore(Options(mount_point));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Ids(), std::vector<std::string>{"small"});
}

TEST(NvmeStoreTest, FailedOverwriteInvalidatesTheTensorDurably) {
  TempDir dir;
  {
    FaultIoBackend* fault = nullptr;
    auto store = OpenFaultStore(Options(dir.path()), &fault);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", Pattern(2 * kBlock, 1)).ok());
    // The disk fills up halfway through the overwrite.
    fault->set_on_issue([](const IoBackendOp& op) -> std::optional<int64_t> {
      if (op.op == IoOp::kWrite && op.offset >= kBlock) return -ENOSPC;
      return std::nullopt;
    });
    const absl::Status status = store->Put("t", Pattern(2 * kBlock, 2));
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_NE(status.message().find("tensor 't'"), std::string::npos) << status;
    EXPECT_NE(status.message().find(dir.path()), std::string::npos) << status;
    EXPECT_FALSE(store->Contains("t"));
    std::vector<std::byte> out(2 * kBlock);
    EXPECT_EQ(store->Get("t", out).code(), absl::StatusCode::kNotFound);
  }
  // Half old, half new bytes must not come back as valid after a restart.
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(store->Contains("t"));
}

TEST(NvmeStoreTest, MissingDirectoryIsNotFound) {
  TempDir dir;
  const std::string missing = dir.Join("no/such/dir");
  const auto store = NvmeStore::Open(Options(missing));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(store.status().message().find(missing), std::string::npos) << store.status();
}

TEST(NvmeStoreTest, ReadOnlyDirectoryIsPermissionDenied) {
  TempDir dir;
  const std::string target = dir.Join("ro");
  ASSERT_EQ(::mkdir(target.c_str(), 0755), 0);
  std::unique_ptr<ScopedMount> mount;
  if (::geteuid() == 0) {
    // Root bypasses mode bits, but not a read-only mount.
    mount = std::make_unique<ScopedMount>(target, "tmpfs", MS_RDONLY, "size=1m");
    if (!mount->mounted()) GTEST_SKIP() << "cannot mount a read-only tmpfs: " << mount->error();
  } else {
    ASSERT_EQ(::chmod(target.c_str(), 0555), 0);
  }
  const auto store = NvmeStore::Open(Options(target));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kPermissionDenied) << store.status();
  EXPECT_NE(store.status().message().find(target), std::string::npos) << store.status();
  ::chmod(target.c_str(), 0755);
}

TEST(NvmeStoreTest, CorruptManifestIsDataLoss) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", Pattern(5000, 1)).ok());
  }
  const std::string manifest = dir.Join("MANIFEST");
  auto text = ReadFileToString(manifest);
  ASSERT_TRUE(text.ok());
  std::string flipped = *text;
  const size_t at = flipped.find(" 5000 ");
  ASSERT_NE(at, std::string::npos) << flipped;
  flipped.replace(at, 6, " 6000 ");
  testing::WriteTextFile(manifest, flipped);
  auto store = NvmeStore::Open(Options(dir.path()));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find(manifest), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find("checksum"), std::string::npos) << store.status();

  testing::WriteTextFile(manifest, "not a manifest\n");
  store = NvmeStore::Open(Options(dir.path()));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
}

TEST(NvmeStoreTest, TruncatedManifestIsDataLoss) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("a", Pattern(10, 1)).ok());
    ASSERT_TRUE(store->Put("b", Pattern(10, 2)).ok());
  }
  const std::string manifest = dir.Join("MANIFEST");
  auto text = ReadFileToString(manifest);
  ASSERT_TRUE(text.ok());
  testing::WriteTextFile(manifest, text->substr(0, text->size() / 2));
  const auto store = NvmeStore::Open(Options(dir.path()));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find("truncated"), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find(manifest), std::string::npos) << store.status();
}

TEST(NvmeStoreTest, MissingSlotFileOfValidTensorIsDataLoss) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", Pattern(10, 1)).ok());
  }
  ASSERT_EQ(::unlink(dir.Join(NvmeStore::SlotFileName("t")).c_str()), 0);
  const auto store = NvmeStore::Open(Options(dir.path()));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
}

TEST(NvmeStoreTest, OrphanedSlotFileFromACrashIsRemoved) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("kept", Pattern(10, 1)).ok());
  }
  // What a crash between creating a slot and recording it leaves behind.
  testing::WriteTextFile(dir.Join("lost-0123456789abcdef.slot"), "partial");
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Ids(), std::vector<std::string>{"kept"});
  EXPECT_EQ(SlotFiles(dir.path()), std::vector<std::string>{NvmeStore::SlotFileName("kept")});
}

TEST(NvmeStoreTest, SecondOpenOfTheSameDirectoryIsRefused) {
  TempDir dir;
  auto first = OpenStore(Options(dir.path()));
  ASSERT_NE(first, nullptr);
  const auto second = NvmeStore::Open(Options(dir.path()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
}

TEST(NvmeStoreTest, CapacityLimitIsResourceExhausted) {
  TempDir dir;
  NvmeStoreOptions options = Options(dir.path());
  options.capacity_bytes = 1 << 20;
  auto store = OpenStore(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put("a", Pattern(512 << 10, 1)).ok());
  const absl::Status status = store->Put("b", Pattern(768 << 10, 2));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("capacity"), std::string::npos) << status;
  EXPECT_FALSE(store->Contains("b"));
  EXPECT_EQ(store->allocated_bytes(), 512 << 10);
}

TEST(NvmeStoreTest, ReserveSurvivesReopenAndIsNotReadable) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Reserve("r", 3 << 20).ok());
    EXPECT_EQ(store->allocated_bytes(), 3 << 20);
    EXPECT_FALSE(store->Contains("r"));
  }
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->allocated_bytes(), 3 << 20);
  EXPECT_FALSE(store->Contains("r"));
  const std::vector<std::byte> data = Pattern(3 << 20, 4);
  ASSERT_TRUE(store->Put("r", data).ok());
  EXPECT_EQ(store->allocated_bytes(), 3 << 20);
  ExpectContents(*store, "r", data);
}

TEST(NvmeStoreTest, RemoveDeletesTheSlot) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", Pattern(10, 1)).ok());
    ASSERT_TRUE(store->Remove("t").ok());
    EXPECT_FALSE(store->Contains("t"));
    EXPECT_EQ(store->Remove("t").code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(SlotFiles(dir.path()).empty());
  }
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Ids().empty());
}

TEST(NvmeStoreTest, ManyTensorsStayWithinTheOpenFileLimit) {
  TempDir dir;
  NvmeStoreOptions options = Options(dir.path());
  options.max_open_files = 4;
  auto store = OpenStore(options);
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(store->Put(absl::StrCat("t", i), Pattern(5000 + i, i)).ok()) << i;
  }
  for (int i = 0; i < 20; ++i) ExpectContents(*store, absl::StrCat("t", i), Pattern(5000 + i, i));
}

TEST(NvmeStoreTest, RegisteredBuffersAreUsedAsFixedBuffers) {
  if (auto probe = ProbeUring(); !probe.ok()) GTEST_SKIP() << "kernel refuses io_uring: " << probe;
  TempDir dir;
  auto store = OpenStore(Options(dir.path(), IoEngineKind::kUring));
  ASSERT_NE(store, nullptr);
  auto arena = AlignedBuffer::Allocate(4 << 20);
  ASSERT_TRUE(arena.ok());
  const std::span<std::byte> region = arena->span();
  ASSERT_TRUE(store->RegisterBuffers({&region, 1}).ok());
  const std::vector<std::byte> data = Pattern(2 << 20, 3);
  std::copy(data.begin(), data.end(), arena->data());
  ASSERT_TRUE(store->Put("t", region.first(2 << 20)).ok());
  ASSERT_TRUE(store->Get("t", region.subspan(2 << 20)).ok());
  EXPECT_EQ(std::memcmp(arena->data() + (2 << 20), data.data(), data.size()), 0);
  EXPECT_GT(store->engine().stats().fixed_buffer_ops, 0);
  EXPECT_GT(store->engine().stats().fixed_file_ops, 0);
}

TEST(NvmeStoreTest, FallsBackToBufferedIoWhereODirectIsRefused) {
  TempDir dir;
  const std::string target = dir.Join("ramfs");
  ASSERT_EQ(::mkdir(target.c_str(), 0755), 0);
  // ramfs has no direct I/O at all (tmpfs gained it in Linux 6.6).
  ScopedMount ramfs(target, "ramfs", 0, nullptr);
  if (!ramfs.mounted()) GTEST_SKIP() << "cannot mount ramfs: " << ramfs.error();
  {
    auto store = OpenStore(Options(target));
    ASSERT_NE(store, nullptr);
    EXPECT_FALSE(store->o_direct());
    PutAllSizes(*store);
  }
  auto store = OpenStore(Options(target));
  ASSERT_NE(store, nullptr);
  ExpectAllSizes(*store);
}

TEST(NvmeStoreTest, InvalidOptionsAreRejected) {
  NvmeStoreOptions options = Options("/tmp");
  options.block_size = 1000;
  EXPECT_EQ(NvmeStore::Open(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Options("");
  EXPECT_EQ(NvmeStore::Open(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Options("/tmp");
  options.queue_depth = 0;
  EXPECT_EQ(NvmeStore::Open(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::offload
