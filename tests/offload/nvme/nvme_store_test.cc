#include "offload/nvme/nvme_store.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "offload/nvme/aligned_buffer.h"
#include "offload/nvme/io_backend.h"
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
std::unique_ptr<NvmeStore> OpenFaultStore(const NvmeStoreOptions& options, FaultIoBackend** fault) {
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
void ExpectContents(NvmeStore& store, const std::string& id, const std::vector<std::byte>& expected) {
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
  // memcmp takes no null pointer, even for 0 bytes (UBSan says so).
  EXPECT_TRUE(size == 0 || std::memcmp(aligned->data(), expected.data(), size) == 0);
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

// Opens and closes the store, which folds its JOURNAL into MANIFEST.
void Reopen(const std::string& dir) {
  auto store = OpenStore(Options(dir));
  ASSERT_NE(store, nullptr);
}

std::string ReadText(const std::string& path) {
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// JOURNAL without its zero-filled tail.
std::string JournalText(const std::string& dir) {
  std::string text = ReadText(dir + "/JOURNAL");
  const size_t last = text.find_last_not_of('\0');
  return last == std::string::npos ? "" : text.substr(0, last + 1);
}

// Complete lines of JOURNAL, header included.
std::vector<std::string> JournalLines(const std::string& dir) {
  std::vector<std::string> lines;
  const std::string text = JournalText(dir);
  for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    lines.push_back(text.substr(pos, nl - pos));
  }
  return lines;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// The generation MANIFEST's header names ("strata-nvme-store 2 <generation>").
uint64_t ManifestGeneration(const std::string& dir) {
  const std::string text = ReadText(dir + "/MANIFEST");
  const std::string prefix = "strata-nvme-store 2 ";
  EXPECT_EQ(text.rfind(prefix, 0), 0u) << text;
  return std::stoull(text.substr(prefix.size(), text.find('\n') - prefix.size()));
}

// Replaces `path` with its first `bytes` bytes.
void TruncateTo(const std::string& path, int64_t bytes) {
  ASSERT_EQ(::truncate(path.c_str(), bytes), 0) << std::strerror(errno);
}

// The directory as a crash at this instant would leave it (the test's
// writes are all synced or not yet issued when this is called).
void CopyDirectory(const std::string& from, const std::string& to) {
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
}

uint64_t Fnv1a64(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// Mounts a filesystem for one test (root only); unmounts on scope exit.
class ScopedMount {
 public:
  ScopedMount(const std::string& target, const char* fstype, unsigned long flags, const char* data) : target_(target) {
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
  Reopen(dir.path());  // moves the record from JOURNAL into MANIFEST
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
  Reopen(dir.path());  // moves the records from JOURNAL into MANIFEST
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

TEST(NvmeStoreTest, SmallChangesAreJournalledAndFoldedInAtOpen) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", Pattern(5000, 1)).ok());
    ASSERT_TRUE(store->Put("t", Pattern(6000, 2)).ok());
  }
  // Header; slot + val of the new tensor; inv; val. MANIFEST is untouched.
  const std::vector<std::string> lines = JournalLines(dir.path());
  ASSERT_EQ(lines.size(), 4u) << JournalText(dir.path());
  EXPECT_EQ(lines[0].rfind("strata-nvme-journal 1 1 ", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("1 slot 8192 " + NvmeStore::SlotFileName("t") + " t val 5000 t ", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("2 inv t ", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("3 val 6000 t ", 0), 0u) << lines[3];
  EXPECT_EQ(ManifestGeneration(dir.path()), 1u);
  EXPECT_EQ(ReadText(dir.Join("MANIFEST")).find("slot "), std::string::npos);

  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  ExpectContents(*store, "t", Pattern(6000, 2));
  EXPECT_EQ(ManifestGeneration(dir.path()), 2u);
  EXPECT_EQ(JournalLines(dir.path()).size(), 1u) << JournalText(dir.path());
}

TEST(NvmeStoreTest, BatchesCommitOnceEachWayAndReadsNotAtAll) {
  TempDir dir;
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  std::vector<std::vector<std::byte>> data;
  std::vector<NvmeWrite> writes;
  for (int i = 0; i < 4; ++i) data.push_back(Pattern(10000 + i, 30 + i));
  for (int i = 0; i < 4; ++i) writes.push_back({absl::StrCat("t", i), data[i]});
  auto ticket = store->StartWrite(writes);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_TRUE(store->Wait(*ticket).ok());
  // New slots: nothing to invalidate, one commit recording all four.
  EXPECT_EQ(JournalLines(dir.path()).size(), 2u) << JournalText(dir.path());

  ticket = store->StartWrite(writes);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_EQ(JournalLines(dir.path()).size(), 3u) << JournalText(dir.path());
  ASSERT_TRUE(store->Wait(*ticket).ok());
  const std::vector<std::string> lines = JournalLines(dir.path());
  ASSERT_EQ(lines.size(), 4u) << JournalText(dir.path());
  EXPECT_EQ(lines[2].rfind("2 inv t0 inv t1 inv t2 inv t3 ", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("3 val 10000 t0 val 10001 t1 val 10002 t2 val 10003 t3 ", 0), 0u) << lines[3];

  const std::string before = ReadText(dir.Join("JOURNAL"));
  std::vector<std::vector<std::byte>> out(4);
  std::vector<NvmeRead> reads;
  for (int i = 0; i < 4; ++i) out[i].resize(data[i].size());
  for (int i = 0; i < 4; ++i) reads.push_back({absl::StrCat("t", i), out[i]});
  ticket = store->StartRead(reads);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_TRUE(store->Wait(*ticket).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], data[i]) << i;
  ASSERT_TRUE(store->Get("t0", out[0]).ok());
  EXPECT_EQ(ReadText(dir.Join("JOURNAL")), before);
}

TEST(NvmeStoreTest, CrashBetweenInvalidateRecordAndDataWriteLeavesTheSlotInvalid) {
  TempDir dir;
  const std::string crashed = dir.Join("crashed");
  const std::string store_dir = dir.Join("store");
  ASSERT_EQ(::mkdir(store_dir.c_str(), 0755), 0);
  const std::vector<std::byte> v1 = Pattern(2 * kBlock + 5, 1);
  const std::vector<std::byte> v2 = Pattern(2 * kBlock + 5, 2);
  {
    FaultIoBackend* fault = nullptr;
    auto store = OpenFaultStore(Options(store_dir), &fault);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", v1).ok());
    // The first data write of the overwrite: its invalidation is durable and
    // no byte of the slot has changed yet. Crash here (copy the directory),
    // then let the write fail as well.
    fault->set_on_issue([&](const IoBackendOp& op) -> std::optional<int64_t> {
      if (op.op != IoOp::kWrite) return std::nullopt;
      if (!std::filesystem::exists(crashed)) CopyDirectory(store_dir, crashed);
      return -EIO;
    });
    EXPECT_FALSE(store->Put("t", v2).ok());
    EXPECT_FALSE(store->Contains("t"));
  }
  ASSERT_TRUE(std::filesystem::exists(crashed));
  EXPECT_EQ(JournalLines(crashed).back().rfind("2 inv t ", 0), 0u) << JournalText(crashed);
  for (const std::string& path : {crashed, store_dir}) {
    SCOPED_TRACE(path);
    auto store = OpenStore(Options(path));
    ASSERT_NE(store, nullptr);
    EXPECT_FALSE(store->Contains("t"));
    EXPECT_TRUE(store->Ids().empty());
  }
}

TEST(NvmeStoreTest, TornLastJournalRecordLeavesThePreRecordState) {
  TempDir dir;
  const std::string store_dir = dir.Join("store");
  const std::string torn_invalidate = dir.Join("torn_invalidate");
  ASSERT_EQ(::mkdir(store_dir.c_str(), 0755), 0);
  const std::vector<std::byte> v1 = Pattern(3 * kBlock + 11, 1);
  const std::vector<std::byte> v2 = Pattern(3 * kBlock + 11, 2);
  {
    FaultIoBackend* fault = nullptr;
    auto store = OpenFaultStore(Options(store_dir), &fault);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", v1).ok());
    fault->set_on_issue([&](const IoBackendOp& op) -> std::optional<int64_t> {
      if (op.op == IoOp::kWrite && !std::filesystem::exists(torn_invalidate)) {
        CopyDirectory(store_dir, torn_invalidate);
      }
      return std::nullopt;
    });
    ASSERT_TRUE(store->Put("t", v2).ok());
  }
  // Cut each copy's last record in half, as a crash in mid-append would.
  for (const std::string& path : {torn_invalidate, store_dir}) {
    const std::string text = JournalText(path);
    const size_t last_start = text.rfind('\n', text.size() - 2) + 1;
    const size_t cut = last_start + (text.size() - last_start) / 2;
    TruncateTo(path + "/JOURNAL", static_cast<int64_t>(cut));
  }
  {
    // The invalidation never completed, so no data was written: still v1.
    auto store = OpenStore(Options(torn_invalidate));
    ASSERT_NE(store, nullptr);
    ExpectContents(*store, "t", v1);
  }
  {
    // The validation never completed: invalid, although the data is whole.
    auto store = OpenStore(Options(store_dir));
    ASSERT_NE(store, nullptr);
    EXPECT_FALSE(store->Contains("t"));
    // Folded into a new MANIFEST: no torn tail is left for new commits to
    // follow.
    EXPECT_EQ(JournalLines(store_dir).size(), 1u) << JournalText(store_dir);
    EXPECT_EQ(JournalText(store_dir).back(), '\n');
    ASSERT_TRUE(store->Put("t", v2).ok());
  }
  auto store = OpenStore(Options(store_dir));
  ASSERT_NE(store, nullptr);
  ExpectContents(*store, "t", v2);
}

TEST(NvmeStoreTest, LastJournalRecordWithBadChecksumIsDropped) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("a", Pattern(100, 1)).ok());
  }
  Reopen(dir.path());
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("b", Pattern(200, 2)).ok());
  }
  // The journal's only commit, damaged.
  std::string text = JournalText(dir.path());
  ASSERT_EQ(JournalLines(dir.path()).size(), 2u) << text;
  const size_t at = text.rfind(" b ");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 1] = 'c';
  testing::WriteTextFile(dir.Join("JOURNAL"), text);
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Ids(), std::vector<std::string>{"a"});
  ExpectContents(*store, "a", Pattern(100, 1));
  // Dropped for good: the journal starts afresh rather than after the damage.
  EXPECT_EQ(JournalLines(dir.path()).size(), 1u) << JournalText(dir.path());
}

TEST(NvmeStoreTest, CorruptMiddleJournalRecordIsDataLoss) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(store->Put(id, Pattern(100, 1)).ok());
  }
  std::string text = JournalText(dir.path());
  const size_t at = text.find(" val 100 b ");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 11, " val 101 b ");
  testing::WriteTextFile(dir.Join("JOURNAL"), text);
  const auto store = NvmeStore::Open(Options(dir.path()));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find(dir.Join("JOURNAL")), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find("line 3"), std::string::npos) << store.status();
}

TEST(NvmeStoreTest, MissingJournalIsDataLoss) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", Pattern(100, 1)).ok());
  }
  ASSERT_EQ(::unlink(dir.Join("JOURNAL").c_str()), 0);
  // Every Open says so: refusing must not create an empty JOURNAL that a
  // second Open would take for a fresh one.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const auto store = NvmeStore::Open(Options(dir.path()));
    EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
    EXPECT_NE(store.status().message().find(dir.Join("JOURNAL")), std::string::npos) << store.status();
  }
}

TEST(NvmeStoreTest, EmptiedJournalAfterACompactionIsDataLoss) {
  TempDir dir;
  for (int i = 0; i < 2; ++i) {  // the second Open compacts: generation 2
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", Pattern(100, i + 1)).ok());
  }
  ASSERT_EQ(::truncate(dir.Join("JOURNAL").c_str(), 0), 0);
  const auto store = NvmeStore::Open(Options(dir.path()));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
}

TEST(NvmeStoreTest, StaleJournalOfAnOlderGenerationIsIgnored) {
  TempDir dir;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("a", Pattern(100, 1)).ok());
    ASSERT_TRUE(store->Put("b", Pattern(200, 2)).ok());
  }
  const std::string stale = ReadText(dir.Join("JOURNAL"));  // generation 1: creates a and b
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Remove("b").ok());
  }
  Reopen(dir.path());
  ASSERT_GT(ManifestGeneration(dir.path()), 1u);
  // What a crash between writing a new MANIFEST and emptying JOURNAL leaves.
  testing::WriteTextFile(dir.Join("JOURNAL"), stale);
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Ids(), std::vector<std::string>{"a"});
  ExpectContents(*store, "a", Pattern(100, 1));
}

// Puts, reserves and removes over a few ids; returns the expected contents.
std::map<std::string, std::vector<std::byte>> Churn(NvmeStore& store, int operations) {
  std::map<std::string, std::vector<std::byte>> expected;
  for (int i = 0; i < operations; ++i) {
    const std::string id = absl::StrCat("layer.", i % 7, "/exp avg");  // a space in the id
    if (i % 11 == 10) {
      if (expected.erase(id) > 0) {
        EXPECT_TRUE(store.Remove(id).ok()) << i;
      }
      continue;
    }
    if (i % 13 == 12) {
      EXPECT_TRUE(store.Reserve(id, 40000).ok()) << i;
      continue;
    }
    std::vector<std::byte> data = Pattern(100 + (i * 997) % 30000, static_cast<uint32_t>(i));
    EXPECT_TRUE(store.Put(id, data).ok()) << i;
    expected[id] = std::move(data);
  }
  return expected;
}

void ExpectExactly(NvmeStore& store, const std::map<std::string, std::vector<std::byte>>& expected) {
  std::vector<std::string> ids;
  for (const auto& [id, data] : expected) ids.push_back(id);
  EXPECT_EQ(store.Ids(), ids);
  for (const auto& [id, data] : expected) ExpectContents(store, id, data);
}

TEST(NvmeStoreTest, ContentsSurviveReopenFromTheJournalAlone) {
  TempDir dir;
  std::map<std::string, std::vector<std::byte>> expected;
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    expected = Churn(*store, 120);
  }
  EXPECT_EQ(ManifestGeneration(dir.path()), 1u);  // never compacted
  EXPECT_GT(JournalLines(dir.path()).size(), 100u);
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  ExpectExactly(*store, expected);
}

TEST(NvmeStoreTest, ContentsSurviveReopenAcrossCompactions) {
  TempDir dir;
  NvmeStoreOptions options = Options(dir.path());
  options.journal_limit_bytes = 4096;
  std::map<std::string, std::vector<std::byte>> expected;
  {
    auto store = OpenStore(options);
    ASSERT_NE(store, nullptr);
    expected = Churn(*store, 400);
    EXPECT_GT(ManifestGeneration(dir.path()), 5u);
    ExpectExactly(*store, expected);
  }
  auto store = OpenStore(options);
  ASSERT_NE(store, nullptr);
  ExpectExactly(*store, expected);
}

TEST(NvmeStoreTest, JournalStaysBoundedOverManySmallPuts) {
  TempDir dir;
  NvmeStoreOptions options = Options(dir.path());
  options.journal_limit_bytes = 4096;
  auto store = OpenStore(options);
  ASSERT_NE(store, nullptr);
  const std::string journal = dir.Join("JOURNAL");
  int64_t largest = 0;
  constexpr int kPuts = 2000;
  for (int i = 0; i < kPuts; ++i) {
    ASSERT_TRUE(store->Put(absl::StrCat("t", i % 16), Pattern(64, i)).ok()) << i;
    largest = std::max(largest, FileSize(journal));
    // Over the limit by at most the one commit that crossed it.
    ASSERT_LE(JournalText(dir.path()).size(), 4096u + 256u) << i;
  }
  EXPECT_LE(largest, 64 << 10);                    // the zero-filled preallocation, never more
  EXPECT_GT(ManifestGeneration(dir.path()), 20u);  // it did compact, many times
  for (int i = kPuts - 16; i < kPuts; ++i) {
    ExpectContents(*store, absl::StrCat("t", i % 16), Pattern(64, i));
  }
}

TEST(NvmeStoreTest, Version1ManifestIsReadAndRewritten) {
  TempDir dir;
  const std::vector<std::byte> data = Pattern(9000, 5);
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("t", data).ok());
    ASSERT_TRUE(store->Reserve("r", 8192).ok());
  }
  Reopen(dir.path());
  // The same state as the previous release wrote it: no generation, no JOURNAL.
  const std::string v2 = ReadText(dir.Join("MANIFEST"));
  const size_t body_start = v2.find('\n') + 1;
  const size_t end_start = v2.rfind("end ");
  std::string v1 = "strata-nvme-store 1\n" + v2.substr(body_start, end_start - body_start);
  v1 += absl::StrCat("end 2 ", absl::StrFormat("%016x", Fnv1a64(v1)), "\n");
  testing::WriteTextFile(dir.Join("MANIFEST"), v1);
  ASSERT_EQ(::unlink(dir.Join("JOURNAL").c_str()), 0);
  {
    auto store = OpenStore(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Ids(), std::vector<std::string>{"t"});
    ExpectContents(*store, "t", data);
    EXPECT_EQ(store->allocated_bytes(), 12288 + 8192);
  }
  EXPECT_EQ(ManifestGeneration(dir.path()), 1u);
  EXPECT_EQ(JournalLines(dir.path()).size(), 1u);

  testing::WriteTextFile(dir.Join("MANIFEST"), "strata-nvme-store 7 1\nend 0 0\n");
  const auto store = NvmeStore::Open(Options(dir.path()));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_NE(store.status().message().find(dir.Join("MANIFEST")), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find("version '7'"), std::string::npos) << store.status();
}

// Timing probe, not a check: mean latency of a small durable overwrite.
// Run with --gtest_also_run_disabled_tests --gtest_filter='*SmallPutLatency*'.
TEST(NvmeStoreTest, DISABLED_SmallPutLatency) {
  TempDir dir;
  auto store = OpenStore(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  const std::vector<std::byte> data = Pattern(4096, 1);
  ASSERT_TRUE(store->Put("t", data).ok());
  constexpr int kPuts = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kPuts; ++i) ASSERT_TRUE(store->Put("t", data).ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ timing   ] %d Puts of 4 KiB: mean %.3f ms\n", kPuts, seconds * 1e3 / kPuts);
}

}  // namespace
}  // namespace strata::offload
