// Small POSIX file helpers shared by every component. errno becomes an
// absl::Status here and nowhere else.
//
// Note: Debian's Abseil is built with its own absl::string_view, which is not
// std::string_view; pass std::string (or absl::string_view) to absl::StrCat.
#ifndef STRATA_BASE_FILE_H_
#define STRATA_BASE_FILE_H_

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

// Maps an errno value to the status code a gRPC client would expect
// (ENOENT -> NOT_FOUND, EACCES -> PERMISSION_DENIED, ENOSPC -> RESOURCE_EXHAUSTED,
// EINVAL -> INVALID_ARGUMENT, ...). `context` names the file or operation.
absl::Status ErrnoToStatus(int err, const std::string& context);

// Reads a whole regular file. NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `parts` back to back to `path` so that readers see either the old file
// or the complete new one: data goes to "<path>.tmp.<pid>", is fsync'ed, then
// renamed over `path`, and the directory is fsync'ed. On failure the
// temporary file is removed.
absl::Status WriteFileAtomically(const std::string& path, std::span<const std::span<const std::byte>> parts);
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);

// Appends `contents` to `path` (created if missing) and fsyncs it before
// returning: on disk once this returns OK.
absl::Status AppendDurably(const std::string& path, std::string_view contents);

// fsyncs directory `dir` ("" is the working directory), so that entries
// created, renamed or removed in it survive a crash.
absl::Status SyncDirectory(const std::string& dir);

// A read-only, private memory mapping of a whole file. Movable, not copyable;
// unmaps on destruction. An empty file maps to an empty span.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const std::byte* data, size_t size) : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const std::byte* data_;
  size_t size_;
};

// Drops the pages under `bytes` (part of a read-only MappedFile) from this
// process's resident set once they have been copied out, so that loading a
// model holds one tensor of its file at a time rather than all of it. The
// next read faults them back in from the page cache; the mapping stays valid.
void ReleaseMappedPages(std::span<const std::byte> bytes);

// Removes `path` and everything under it, as `rm -rf` does; true when
// nothing of it is left (a missing path included). Use it instead of
// std::filesystem::remove_all: PyTorch 2.11's libtorch.so exports its own
// copy of that function, whose call into recursive_directory_iterator is
// unresolved there, and a binary linked against it binds to that copy and
// jumps to address 0 (seen on the GPU machine).
bool RemoveTree(const std::string& path);

// True when `path` names an existing directory / regular file.
bool IsDirectory(const std::string& path);
bool IsRegularFile(const std::string& path);

// Joins two path pieces with exactly one '/'.
std::string JoinPath(std::string_view a, std::string_view b);

}  // namespace strata

#endif  // STRATA_BASE_FILE_H_
