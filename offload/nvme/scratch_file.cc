#include "offload/nvme/scratch_file.h"

#include <atomic>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/nvme/aligned_buffer.h"

namespace strata::offload {

namespace {

constexpr int64_t kBlock = static_cast<int64_t>(kDirectIoAlignment);

// An unnamed file in `dir`: O_TMPFILE where the filesystem has it, else a
// file created and unlinked at once (the window between is a few
// microseconds; a crash inside it leaves a ".strata-scratch-*" file).
absl::StatusOr<int> OpenUnnamed(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
    return ErrnoToStatus(errno, absl::StrCat("scratch file in ", dir));
  }
  std::string name = JoinPath(dir, ".strata-scratch-XXXXXX");
  fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("scratch file in ", dir));
  ::unlink(name.c_str());
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ScratchFile>> ScratchFile::Create(const ScratchFileOptions& options) {
  IoEngineOptions engine_options;
  engine_options.kind = options.engine;
  engine_options.queue_depth = std::max(1, options.queue_depth);
  // A slot in at most queue_depth pieces: one Start keeps them all in flight.
  const int64_t piece = (std::max<int64_t>(options.slot_bytes, 1) + engine_options.queue_depth - 1) /
                        engine_options.queue_depth;
  engine_options.chunk_size =
      std::clamp<int64_t>(static_cast<int64_t>(RoundUpTo(static_cast<size_t>(piece), kDirectIoAlignment)),
                          int64_t{64} << 10, int64_t{1} << 30);
  STRATA_ASSIGN_OR_RETURN(auto engine, IoEngine::Create(engine_options));
  return Create(options, std::move(engine));
}

absl::StatusOr<std::unique_ptr<ScratchFile>> ScratchFile::Create(const ScratchFileOptions& options,
                                                                 std::unique_ptr<IoEngine> engine) {
  if (options.slot_bytes <= 0 || options.slots <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("scratch file: slot_bytes and slots must be positive, got ",
                                                   options.slot_bytes, " and ", options.slots));
  }
  const std::string& dir = options.directory;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("scratch directory ", dir));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("scratch directory ", dir, " is not a directory"));
  }
  STRATA_ASSIGN_OR_RETURN(const int fd, OpenUnnamed(dir));
  // Direct I/O where the filesystem takes it: activations are read once,
  // and the page cache would only double their host footprint.
  bool o_direct = true;
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_DIRECT) != 0) {
    o_direct = false;
    STRATA_LOG(Warning) << "filesystem of " << dir << " refuses O_DIRECT; activations use buffered I/O";
  }
  const int64_t slot_bytes = static_cast<int64_t>(RoundUpTo(static_cast<size_t>(options.slot_bytes), kBlock));
  const int64_t total = slot_bytes * options.slots;
  if (::fallocate(fd, 0, 0, total) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP || ::ftruncate(fd, total) != 0) {
      ::close(fd);
      return ErrnoToStatus(err == EOPNOTSUPP ? errno : err,
                           absl::StrCat("scratch file of ", total, " bytes (", options.slots, " slots) in ", dir));
    }
  }
  return std::unique_ptr<ScratchFile>(new ScratchFile(dir, fd, o_direct, slot_bytes, options.slots, std::move(engine)));
}

namespace {
std::atomic<int64_t> g_open_bytes{0};
}  // namespace

int64_t ScratchFile::OpenBytes() { return g_open_bytes.load(std::memory_order_relaxed); }

ScratchFile::ScratchFile(std::string directory, int fd, bool o_direct, int64_t slot_bytes, int64_t slots,
                         std::unique_ptr<IoEngine> engine)
    : directory_(std::move(directory)),
      fd_(fd),
      o_direct_(o_direct),
      slot_bytes_(slot_bytes),
      slots_(slots),
      engine_(std::move(engine)) {
  g_open_bytes.fetch_add(slot_bytes_ * slots_, std::memory_order_relaxed);
}

ScratchFile::~ScratchFile() {
  engine_.reset();  // waits for what is in flight
  ::close(fd_);
  g_open_bytes.fetch_sub(slot_bytes_ * slots_, std::memory_order_relaxed);
}

absl::StatusOr<ScratchFile::Ticket> ScratchFile::StartWrite(int64_t slot, std::span<const std::byte> bytes) {
  // The engine writes from the pointer only; constness is the caller's view.
  return Start(IoOp::kWrite, slot, const_cast<std::byte*>(bytes.data()), static_cast<int64_t>(bytes.size()));
}

absl::StatusOr<ScratchFile::Ticket> ScratchFile::StartRead(int64_t slot, std::span<std::byte> bytes) {
  return Start(IoOp::kRead, slot, bytes.data(), static_cast<int64_t>(bytes.size()));
}

absl::StatusOr<ScratchFile::Ticket> ScratchFile::Start(IoOp op, int64_t slot, std::byte* data, int64_t length) {
  if (slot < 0 || slot >= slots_) {
    return absl::InvalidArgumentError(absl::StrCat("scratch file: slot ", slot, " out of [0, ", slots_, ")"));
  }
  if (length > slot_bytes_ || length % kBlock != 0 || reinterpret_cast<uintptr_t>(data) % kBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat("scratch file: a transfer must be 4096-aligned and at most ",
                                                   slot_bytes_, " bytes, got ", length));
  }
  IoRequest request;
  request.op = op;
  request.file = fd_;
  request.offset = slot * slot_bytes_;
  request.buffer = data;
  request.length = length;
  request.tag = next_ticket_++;
  request.path = absl::StrCat("activation scratch file in ", directory_, " (slot ", slot, ")");
  STRATA_RETURN_IF_ERROR(engine_->Submit(request));
  return request.tag;
}

absl::Status ScratchFile::Wait(Ticket ticket) {
  while (true) {
    auto it = std::find_if(finished_.begin(), finished_.end(),
                           [ticket](const IoCompletion& c) { return c.tag == ticket; });
    if (it != finished_.end()) {
      absl::Status status = std::move(it->status);
      finished_.erase(it);
      return status;
    }
    if (engine_->pending() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("scratch file: unknown ticket ", ticket));
    }
    STRATA_RETURN_IF_ERROR(engine_->Wait(1, &finished_));
  }
}

}  // namespace strata::offload
