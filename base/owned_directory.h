// Scratch directories that belong to one live process, and the sweep that
// removes those whose process is gone. The owner keeps an OWNER file in the
// directory locked (flock) for as long as the directory lives; the kernel
// drops the lock when the process dies, however it dies (kill -9 included),
// so a later process tells an abandoned directory from a live one without
// a registry that could itself be lost.
#ifndef STRATA_BASE_OWNED_DIRECTORY_H_
#define STRATA_BASE_OWNED_DIRECTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

class OwnedDirectory {
 public:
  // Creates PARENT/PREFIX-XXXXXX (PARENT too if missing), empty but for its
  // locked OWNER file. Errors name the parent.
  static absl::StatusOr<std::unique_ptr<OwnedDirectory>> Create(const std::string& parent, const std::string& prefix);
  // Removes the directory, then lets go of the lock.
  ~OwnedDirectory();
  OwnedDirectory(const OwnedDirectory&) = delete;
  OwnedDirectory& operator=(const OwnedDirectory&) = delete;

  const std::string& path() const { return path_; }

 private:
  OwnedDirectory(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_;
};

struct SweepResult {
  std::vector<std::string> removed;  // directories whose owner was gone
  int64_t bytes = 0;                 // the size of their files
  std::vector<std::string> failed;   // abandoned, but not all of it could be removed
};

// Removes every directory PARENT/PREFIX... (any name that starts with
// PREFIX) whose OWNER file no process holds locked. A directory without an OWNER file is not one of ours and stays; so
// does one whose owner is alive (its lock is held). A missing PARENT sweeps
// nothing.
SweepResult SweepAbandonedDirectories(const std::string& parent, const std::string& prefix);

}  // namespace strata

#endif  // STRATA_BASE_OWNED_DIRECTORY_H_
