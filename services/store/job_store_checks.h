// What every JobStore implementation checks and says the same way: argument
// checks, id and page-token formats, and the errors the contract names.
// Internal to services/store.
#ifndef STRATA_SERVICES_STORE_JOB_STORE_CHECKS_H_
#define STRATA_SERVICES_STORE_JOB_STORE_CHECKS_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/store/job_store.h"

namespace strata::services::store_checks {

inline constexpr std::array<JobState, 5> kAllStates = {JobState::kQueued, JobState::kRunning, JobState::kSucceeded,
                                                       JobState::kFailed, JobState::kCancelled};

// Ids become part of keys; a plain alphabet means an id can never name
// another job's sub-key ("x:events").
absl::Status ValidateJobId(const std::string& what, const std::string& id);
absl::Status ValidateWorkerId(const std::string& id);
absl::Status ValidateTtl(int ttl_ms);
// A tenant's request ids are keyed under its name ("<tenant>:<id>"); a
// caller without a tenant may not use ':' in one, or its key could name
// a tenant's request.
absl::Status ValidateRequestId(const std::string& tenant, const std::string& request_id);
// The key a request id is kept under: "<tenant>:<id>", or "<id>" without a tenant.
std::string RequestKey(const std::string& tenant, const std::string& request_id);
absl::Status ValidateIteration(int64_t iteration);
// "job-" and 12 hex digits (48 random bits).
std::string NewJobId();

absl::Status JobNotFound(const std::string& id);
absl::Status WorkerNotRegistered(const std::string& id);

// page_size after the contract's defaults (0: 50, at most 1000);
// INVALID_ARGUMENT when negative.
absl::StatusOr<int> PageSize(int page_size);
// Tokens name the creation sequence a page ends at, so jobs created between
// calls neither repeat nor push entries off a page.
std::string EncodePageToken(int64_t seq);
absl::StatusOr<int64_t> DecodePageToken(const std::string& token);

// ReadEvents' arguments; returns the count after its defaults (0: 100, at
// most 10000).
absl::StatusOr<int> EventCount(const std::string& after_id, int count, int block_ms);
// Stream ids are "<ms>" or "<ms>-<seq>".
bool IsStreamId(const std::string& id);

// Transition's arguments: a non-empty `from`, only worker expected, only
// the fields a worker or the scheduler reports, integer iterations.
absl::Status CheckTransition(const std::vector<JobState>& from, const std::map<std::string, std::string>& fields,
                             const std::map<std::string, std::string>& expect);
// The FAILED_PRECONDITION a transition from `current` gets.
absl::Status TransitionRefused(const std::string& id, JobState current, const std::vector<JobState>& from, JobState to);
// The FAILED_PRECONDITION a transition gets when `field` holds `actual`.
absl::Status ClaimMoved(const std::string& id, JobState current, const std::string& field, const std::string& actual,
                        const std::string& expected, JobState to);
// A continuation of `ended` refused: it is not FAILED or CANCELLED, or
// `continued_by` continues it already.
absl::Status NotContinuable(const std::string& ended, const std::string& state);
absl::Status ContinuedAlready(const std::string& ended, const std::string& continued_by);

}  // namespace strata::services::store_checks

#endif  // STRATA_SERVICES_STORE_JOB_STORE_CHECKS_H_
