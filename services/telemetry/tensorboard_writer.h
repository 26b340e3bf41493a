// Training curves as TensorBoard event files, the format TRL, verl and
// OpenRLHF users open: `tensorboard --logdir <output.dir>/tensorboard`.
// Each file is a sequence of TFRecords (length, masked CRC-32C of the
// length, an Event message, masked CRC-32C of the message).
#ifndef STRATA_SERVICES_TELEMETRY_TENSORBOARD_WRITER_H_
#define STRATA_SERVICES_TELEMETRY_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::services {

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file in it, which starts with
  // the file-version event. `fresh` first removes the event files already
  // there (a run that starts over); otherwise they stay (a resumed run adds
  // a file, and TensorBoard merges the files of one directory).
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(const std::string& dir, bool fresh);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event with a scalar per entry at `step`, written through to the
  // file (a crash loses no finished iteration). Tags are the metric names
  // ("eval/score", "time/rollout_s", ...), which TensorBoard groups by the
  // part before the slash.
  absl::Status WriteScalars(int64_t step, const std::map<std::string, double>& scalars, double wall_time_s);

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  absl::Status WriteRecord(const std::string& payload);

  const std::string path_;
  const int fd_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_TELEMETRY_TENSORBOARD_WRITER_H_
