#include "services/telemetry/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "services/telemetry/crc32c.h"
#include "services/telemetry/tensorboard_event.pb.h"

namespace strata::services {
namespace {

constexpr std::string_view kEventFileTag = "tfevents";

std::string LittleEndian(uint64_t value, int bytes) {
  std::string out(static_cast<size_t>(bytes), '\0');
  for (int i = 0; i < bytes; ++i) out[static_cast<size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return out;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(const std::string& dir, bool fresh) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("tensorboard: cannot create ", dir, ": ", ec.message()));
  if (fresh) {
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (entry.path().filename().string().find(kEventFileTag) != std::string::npos) {
        std::filesystem::remove(entry.path(), ec);
      }
    }
  }
  // TensorBoard's naming: events.out.tfevents.<seconds>.<host>; the pid and
  // a counter keep two writers of one second apart.
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const auto seconds = static_cast<int64_t>(NowSeconds());
  std::string path;
  int fd = -1;
  for (int n = 0; fd < 0; ++n) {
    path = JoinPath(dir, absl::StrCat("events.out.tfevents.", seconds, ".", host, ".", ::getpid(), ".", n));
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    const int err = errno;
    if (fd < 0 && (err != EEXIST || n > 100)) return ErrnoToStatus(err, absl::StrCat("tensorboard: create ", path));
  }
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(path, fd));
  tensorboard::Event version;
  version.set_wall_time(NowSeconds());
  version.set_file_version("brain.Event:2");
  STRATA_RETURN_IF_ERROR(writer->WriteRecord(version.SerializeAsString()));
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() { ::close(fd_); }

absl::Status TensorBoardWriter::WriteScalars(int64_t step, const std::map<std::string, double>& scalars,
                                             double wall_time_s) {
  tensorboard::Event event;
  event.set_wall_time(wall_time_s);
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    tensorboard::SummaryValue* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return WriteRecord(event.SerializeAsString());
}

absl::Status TensorBoardWriter::WriteRecord(const std::string& payload) {
  const std::string length = LittleEndian(payload.size(), 8);
  const std::string record = absl::StrCat(length, LittleEndian(MaskedCrc32c(length), 4), payload,
                                          LittleEndian(MaskedCrc32c(payload), 4));
  // One write per record with O_APPEND: a record is never interleaved, and a
  // short write (full disk) is reported rather than retried into a torn file.
  const ssize_t written = ::write(fd_, record.data(), record.size());
  if (written < 0) {
    const int err = errno;
    return ErrnoToStatus(err, absl::StrCat("tensorboard: write ", path_));
  }
  if (static_cast<size_t>(written) != record.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensorboard: write ", path_, ": ", written, " of ", record.size(), " bytes (disk full?)"));
  }
  return absl::OkStatus();
}

}  // namespace strata::services
