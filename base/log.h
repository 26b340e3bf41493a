// One process-wide logger: lines go to stderr as "I1121 19:22:03 file.cc:42] msg".
// Libraries log through STRATA_LOG; only main() changes the level.
#ifndef STRATA_BASE_LOG_H_
#define STRATA_BASE_LOG_H_

#include <sstream>
#include <string_view>

namespace strata {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below `level` are dropped. Thread-safe.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

// Parses "debug", "info", "warning", "error"; false for anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

// Collects one message and writes it, whole, when destroyed.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Turns the stream expression into void for STRATA_LOG's ?: operator.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace strata

// The ?: form (as glog does) keeps `if (x) STRATA_LOG(Info) << ...; else`
// unambiguous and skips formatting below the level.
#define STRATA_LOG(level)                                  \
  (::strata::LogLevel::k##level < ::strata::MinLogLevel()) \
      ? (void)0                                            \
      : ::strata::LogVoidify() & ::strata::LogMessage(::strata::LogLevel::k##level, __FILE__, __LINE__).stream()

#endif  // STRATA_BASE_LOG_H_
