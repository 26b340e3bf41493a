#include "base/file.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata {

absl::Status ErrnoToStatus(int err, const std::string& context) {
  const std::string message = absl::StrCat(context, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EINVAL:
    case EISDIR:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    case EAGAIN:
    case EINTR:
    case EBUSY:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace {

// Closes an fd on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

absl::Status WriteAll(int fd, std::span<const std::byte> data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, " is a directory"));
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open directory ", dir));
  FdCloser closer(fd);
  // Some file systems cannot sync a directory (EINVAL): nothing more to do there.
  if (::fsync(fd) != 0 && errno != EINVAL) return ErrnoToStatus(errno, absl::StrCat("fsync ", dir));
  return absl::OkStatus();
}

absl::Status AppendDurably(const std::string& path, std::string_view contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  FdCloser closer(fd);
  STRATA_RETURN_IF_ERROR(
      WriteAll(fd, std::span(reinterpret_cast<const std::byte*>(contents.data()), contents.size()), path));
  if (::fsync(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", path));
  if (::close(closer.release()) != 0) return ErrnoToStatus(errno, absl::StrCat("close ", path));
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, std::span<const std::span<const std::byte>> parts) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", tmp));
  absl::Status status;
  for (const auto& part : parts) {
    status = WriteAll(fd, part, tmp);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoToStatus(errno, absl::StrCat("fsync ", tmp));
  if (::close(fd) != 0 && status.ok()) status = ErrnoToStatus(errno, absl::StrCat("close ", tmp));
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("rename ", tmp, " -> ", path));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // The rename itself lives in the directory: synced too, or a crash can
  // bring the old file back.
  return SyncDirectory(std::filesystem::path(path).parent_path().string());
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  const std::span<const std::byte> part(reinterpret_cast<const std::byte*>(contents.data()), contents.size());
  return WriteFileAtomically(path, std::span<const std::span<const std::byte>>(&part, 1));
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return std::unique_ptr<MappedFile>(new MappedFile(path, nullptr, 0));
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (data == MAP_FAILED) return ErrnoToStatus(errno, absl::StrCat("mmap ", path));
  return std::unique_ptr<MappedFile>(new MappedFile(path, static_cast<const std::byte*>(data), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

void ReleaseMappedPages(std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // Whole pages only: a page shared with a neighbouring tensor goes too, and
  // is read back from the page cache if that tensor is copied later.
  const uintptr_t start = reinterpret_cast<uintptr_t>(bytes.data()) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(bytes.data() + bytes.size());
  // Advice only: failure leaves the pages resident, which is still correct.
  (void)::madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
}

namespace {
thread_local bool remove_tree_failed = false;

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) != 0 && errno != ENOENT) remove_tree_failed = true;
  return 0;  // keep going: remove what can be removed
}
}  // namespace

bool RemoveTree(const std::string& path) {
  remove_tree_failed = false;
  // Depth first (children before their directory), not following links.
  if (::nftw(path.c_str(), RemoveEntry, 32, FTW_DEPTH | FTW_PHYS) != 0) return errno == ENOENT;
  return !remove_tree_failed;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  std::string joined(a);
  const bool a_slash = a.back() == '/';
  const bool b_slash = b.front() == '/';
  if (a_slash && b_slash) b.remove_prefix(1);
  if (!a_slash && !b_slash) joined += '/';
  joined += b;
  return joined;
}

}  // namespace strata
