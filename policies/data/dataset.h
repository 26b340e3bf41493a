// A job's examples as they are on disk: JSON Lines, one record (a JSON
// object) per line, each with the fields its algorithm reads ("prompt";
// "response" for SFT; "chosen" and "rejected" for preferences).
#ifndef STRATA_POLICIES_DATA_DATASET_H_
#define STRATA_POLICIES_DATA_DATASET_H_

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace strata::policies {

// One line of a dataset: a JSON object.
using Record = nlohmann::json;

// The records of the JSONL file at `path`, in file order, each checked to
// hold every one of `fields` as a string; blank lines are skipped. Errors:
// the file's own (NOT_FOUND, ...), and INVALID_ARGUMENT naming path:line for
// a line that is not a JSON object or lacks a field, or naming the path when
// the file holds no record at all.
absl::StatusOr<std::vector<Record>> ReadJsonl(const std::string& path, const std::vector<std::string>& fields);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DATA_DATASET_H_
