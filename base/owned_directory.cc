#include "base/owned_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"

namespace strata {

namespace {

constexpr const char* kOwnerFile = "OWNER";

int64_t TreeBytes(const std::string& path) {
  static thread_local int64_t total;
  total = 0;
  ::nftw(
      path.c_str(),
      [](const char*, const struct stat* st, int type, struct FTW*) {
        if (type == FTW_F) total += st->st_size;
        return 0;
      },
      16, FTW_PHYS);
  return total;
}

}  // namespace

absl::StatusOr<std::unique_ptr<OwnedDirectory>> OwnedDirectory::Create(const std::string& parent,
                                                                       const std::string& prefix) {
  if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("cannot create ", parent));
  }
  // A sweep may lock an OWNER file in the instant between its creation and
  // the creator's lock, and remove the directory: the creator then finds
  // its file unlinked and makes another.
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::string path = JoinPath(parent, prefix + "-XXXXXX");
    if (::mkdtemp(path.data()) == nullptr)
      return ErrnoToStatus(errno, absl::StrCat("cannot create a directory in ", parent));
    const int fd = ::open(JoinPath(path, kOwnerFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      RemoveTree(path);
      return ErrnoToStatus(err, absl::StrCat("cannot create ", JoinPath(path, kOwnerFile)));
    }
    struct stat st {};
    if (::flock(fd, LOCK_EX) == 0 && ::fstat(fd, &st) == 0 && st.st_nlink > 0) {
      return std::unique_ptr<OwnedDirectory>(new OwnedDirectory(std::move(path), fd));
    }
    ::close(fd);
  }
  return absl::UnavailableError(absl::StrCat("cannot keep a directory in ", parent, ": each was swept as it was made"));
}

OwnedDirectory::~OwnedDirectory() {
  RemoveTree(path_);
  ::close(fd_);
}

SweepResult SweepAbandonedDirectories(const std::string& parent, const std::string& prefix) {
  SweepResult result;
  DIR* dir = ::opendir(parent.c_str());
  if (dir == nullptr) return result;
  std::vector<std::string> candidates;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (absl::StartsWith(name, prefix) && name != "." && name != "..") candidates.push_back(JoinPath(parent, name));
  }
  ::closedir(dir);
  for (const std::string& path : candidates) {
    const int fd = ::open(JoinPath(path, kOwnerFile).c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;  // not ours, or not a directory
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      const int64_t bytes = TreeBytes(path);
      if (RemoveTree(path)) {
        result.removed.push_back(path);
        result.bytes += bytes;
      } else {
        result.failed.push_back(path);
      }
    }
    ::close(fd);
  }
  return result;
}

}  // namespace strata
