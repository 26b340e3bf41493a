// strata-soak: the chaos soak as one command.
//
//   strata-soak --dir /tmp/soak --duration 30m --seed 7 --report soak.json
//
// Exits 0 when every invariant held, 1 when one broke (the report says
// which), 2 on a usage error or a stack that did not start.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/soak/soak.h"

namespace {

constexpr char kUsage[] =
    "usage: strata-soak --dir DIR [--duration 120s|30m] [--seed N] [--workers N] [--jobs-in-flight N]\n"
    "                   [--mean-fault-gap SECONDS] [--report FILE] [--plant]\n";

// "90", "90s" or "30m" in seconds; -1 when malformed.
int64_t ParseDuration(std::string text) {
  int64_t scale = 1;
  if (!text.empty() && (text.back() == 's' || text.back() == 'm')) {
    scale = text.back() == 'm' ? 60 : 1;
    text.pop_back();
  }
  int64_t value = 0;
  return absl::SimpleAtoi(text, &value) && value > 0 ? value * scale : -1;
}

}  // namespace

int main(int argc, char** argv) {
  strata::soak::SoakOptions options;
  std::string report_path;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << flag << " needs a value\n" << kUsage;
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](const std::string& text) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(text, &n) || n < 0) {
        std::cerr << flag << ": \"" << text << "\" is not a number\n";
        std::exit(2);
      }
      return n;
    };
    if (flag == "--dir") {
      options.dir = value();
    } else if (flag == "--duration") {
      const std::string text = value();
      const int64_t seconds = ParseDuration(text);
      if (seconds < 0) {
        std::cerr << "--duration: \"" << text << "\" is not a duration (90s, 30m)\n";
        return 2;
      }
      options.duration = std::chrono::seconds(seconds);
    } else if (flag == "--seed") {
      options.seed = static_cast<uint64_t>(number(value()));
    } else if (flag == "--workers") {
      options.workers = static_cast<int>(number(value()));
    } else if (flag == "--jobs-in-flight") {
      options.max_jobs_in_flight = static_cast<int>(number(value()));
    } else if (flag == "--mean-fault-gap") {
      const std::string text = value();
      if (!absl::SimpleAtod(text, &options.mean_seconds_between_faults) || options.mean_seconds_between_faults <= 0) {
        std::cerr << "--mean-fault-gap: \"" << text << "\" is not a positive number of seconds\n";
        return 2;
      }
    } else if (flag == "--report") {
      report_path = value();
    } else if (flag == "--plant") {
      options.plant_faults = true;
    } else {
      std::cerr << "unknown flag " << flag << "\n" << kUsage;
      return 2;
    }
  }
  if (options.dir.empty()) {
    std::cerr << "--dir is required\n" << kUsage;
    return 2;
  }
  std::filesystem::create_directories(options.dir);
  options.dir = std::filesystem::absolute(options.dir).string();
  auto report = strata::soak::RunSoak(options);
  if (!report.ok()) {
    std::cerr << "strata-soak: " << report.status().message() << "\n";
    return 2;
  }
  if (!report_path.empty()) std::ofstream(report_path) << report->ToJson() << "\n";
  std::cout << report->Summary();
  return report->violations.empty() ? 0 : 1;
}
