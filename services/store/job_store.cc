#include "services/store/job_store.h"

#include <algorithm>
#include <cctype>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/store/job_store_checks.h"

namespace strata::services {

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

absl::StatusOr<JobState> ParseJobState(const std::string& name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  for (const JobState state : store_checks::kAllStates) {
    if (upper == JobStateName(state)) return state;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown job state \"", absl::CHexEscape(name),
                                                 "\" (expected QUEUED, RUNNING, SUCCEEDED, FAILED or CANCELLED)"));
}

bool IsTerminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed || state == JobState::kCancelled;
}

namespace store_checks {
namespace {

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;
constexpr int kDefaultEventCount = 100;
constexpr int kMaxEventCount = 10000;
constexpr size_t kMaxIdLength = 128;
constexpr size_t kMaxRequestIdLength = 256;
constexpr char kPageTokenPrefix[] = "seq:";

bool Digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

}  // namespace

absl::Status ValidateJobId(const std::string& what, const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (id.size() > kMaxIdLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is longer than ", kMaxIdLength, " bytes"));
  }
  for (const unsigned char c : id) {
    if (!std::isalnum(c) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " \"", absl::CHexEscape(id), "\" may contain only letters, digits, '-', '_' and '.'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkerId(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("worker id is empty");
  if (id.size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("worker id is longer than ", kMaxRequestIdLength, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTtl(int ttl_ms) {
  if (ttl_ms <= 0) return absl::InvalidArgumentError(absl::StrCat("ttl_ms must be positive, got ", ttl_ms));
  return absl::OkStatus();
}

absl::Status ValidateRequestId(const std::string& tenant, const std::string& request_id) {
  if (request_id.size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("request_id is longer than ", kMaxRequestIdLength, " bytes"));
  }
  if (tenant.empty() && request_id.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id \"", absl::CHexEscape(request_id), "\" may not contain ':' without a tenant"));
  }
  return absl::OkStatus();
}

std::string RequestKey(const std::string& tenant, const std::string& request_id) {
  return tenant.empty() ? request_id : absl::StrCat(tenant, ":", request_id);
}

absl::Status ValidateIteration(int64_t iteration) {
  if (iteration < 0) return absl::InvalidArgumentError(absl::StrCat("iteration must not be negative, got ", iteration));
  return absl::OkStatus();
}

std::string NewJobId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "job-";
  uint64_t bits = rng();
  for (int i = 0; i < 12; ++i) {
    id.push_back(kHex[bits & 0xf]);
    bits >>= 4;
  }
  return id;
}

absl::Status JobNotFound(const std::string& id) { return absl::NotFoundError(absl::StrCat("job ", id, " not found")); }

absl::Status WorkerNotRegistered(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("worker ", id, " is not registered (its registration expired)"));
}

absl::StatusOr<int> PageSize(int page_size) {
  if (page_size < 0) return absl::InvalidArgumentError(absl::StrCat("page_size must not be negative, got ", page_size));
  return page_size == 0 ? kDefaultPageSize : std::min(page_size, kMaxPageSize);
}

std::string EncodePageToken(int64_t seq) { return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, seq)); }

absl::StatusOr<int64_t> DecodePageToken(const std::string& token) {
  std::string plain;
  int64_t seq = 0;
  if (!absl::WebSafeBase64Unescape(token, &plain) || !absl::StartsWith(plain, kPageTokenPrefix) ||
      !absl::SimpleAtoi(plain.substr(sizeof(kPageTokenPrefix) - 1), &seq) || seq <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_token \"", absl::CHexEscape(token), "\" is not valid"));
  }
  return seq;
}

bool IsStreamId(const std::string& id) {
  const size_t dash = id.find('-');
  if (dash == std::string::npos) return Digits(id);
  return Digits(id.substr(0, dash)) && Digits(id.substr(dash + 1));
}

absl::StatusOr<int> EventCount(const std::string& after_id, int count, int block_ms) {
  // A malformed id would reach Redis as an error reply, which is not the
  // caller's to retry.
  if (!after_id.empty() && !IsStreamId(after_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("after_id \"", absl::CHexEscape(after_id), "\" is not a stream entry id (<ms>-<seq>)"));
  }
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("count must not be negative, got ", count));
  if (block_ms < 0) return absl::InvalidArgumentError(absl::StrCat("block_ms must not be negative, got ", block_ms));
  return count == 0 ? kDefaultEventCount : std::min(count, kMaxEventCount);
}

absl::Status CheckTransition(const std::vector<JobState>& from, const std::map<std::string, std::string>& fields,
                             const std::map<std::string, std::string>& expect) {
  if (from.empty()) return absl::InvalidArgumentError("Transition: `from` lists no states");
  for (const auto& [field, value] : expect) {
    if (field != "worker") {
      return absl::InvalidArgumentError(
          absl::StrCat("Transition: field \"", absl::CHexEscape(field), "\" cannot be expected (only worker)"));
    }
  }
  for (const auto& [field, value] : fields) {
    // The state, ids, sequence and timestamps belong to the store; only
    // fields a worker or the scheduler legitimately reports may ride along.
    static const std::array<std::string, 6> kAllowed = {"worker",     "error_code", "error_message",
                                                        "output_dir", "iteration",  "iterations"};
    if (std::find(kAllowed.begin(), kAllowed.end(), field) == kAllowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Transition: field \"", absl::CHexEscape(field),
                                                     "\" cannot be set (allowed: ", absl::StrJoin(kAllowed, ", "),
                                                     ")"));
    }
    int64_t number = 0;
    if ((field == "iteration" || field == "iterations") && !absl::SimpleAtoi(value, &number)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Transition: field ", field, " must be an integer, got \"", absl::CHexEscape(value), "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status TransitionRefused(const std::string& id, JobState current, const std::vector<JobState>& from,
                               JobState to) {
  std::vector<std::string> allowed;
  for (const JobState state : from) allowed.push_back(JobStateName(state));
  return absl::FailedPreconditionError(
      absl::StrCat("job ", id, " is ", JobStateName(current), "; cannot move it to ", JobStateName(to),
                   IsTerminal(current) ? " (a finished job never changes state)"
                                       : absl::StrCat(" (allowed only from ", absl::StrJoin(allowed, ", "), ")")));
}

absl::Status ClaimMoved(const std::string& id, JobState current, const std::string& field, const std::string& actual,
                        const std::string& expected, JobState to) {
  return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", JobStateName(current), " with ", field, " \"",
                                                    actual, "\", not \"", expected, "\"; cannot move it to ",
                                                    JobStateName(to)));
}

absl::Status NotContinuable(const std::string& ended, const std::string& state) {
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", ended, " is ", state, "; only a FAILED or CANCELLED job can be continued (cancel a running one first)"));
}

absl::Status ContinuedAlready(const std::string& ended, const std::string& continued_by) {
  return absl::FailedPreconditionError(absl::StrCat("job ", ended, " is continued already, by job ", continued_by,
                                                    " (an ended job is continued once; continue ", continued_by,
                                                    " if it ended too)"));
}

}  // namespace store_checks
}  // namespace strata::services
