// Rank 0's record of a run's iterations: one JSON object per line in the
// metrics file (<output.dir>/metrics.jsonl unless named) and the same
// numbers as TensorBoard curves under <output.dir>/tensorboard.
#ifndef STRATA_SERVICES_RANK_METRICS_LOG_H_
#define STRATA_SERVICES_RANK_METRICS_LOG_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "services/telemetry/tensorboard_writer.h"

namespace strata::services {

// Not thread-safe: the rank's work thread uses it.
class MetricsLog {
 public:
  // `metrics_path` "" is <output_dir>/metrics.jsonl. Touches no file yet.
  MetricsLog(const std::string& output_dir, const std::string& metrics_path);
  ~MetricsLog();

  // As the run starts: a fresh run (no `resumed_lines`) empties the file and
  // the curves; a resumed one keeps the lines its checkpoint follows, each
  // of which must be whole JSON (DATA_LOSS naming the file and line: a run
  // must not append after a line a crash cut short), and its curves.
  absl::Status Start(std::optional<int64_t> resumed_lines);
  // Appends one iteration's line, on disk (fsync'ed) before it returns: a
  // checkpoint's state.json counts the lines, and a crash must not leave
  // fewer than it says. Then its numbers as curves, once started.
  absl::Status Append(const std::string& line);

 private:
  const std::string path_;
  const std::string tensorboard_dir_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_METRICS_LOG_H_
