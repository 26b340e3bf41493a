// A job's examples as they are on disk: JSON Lines, one record (a JSON
// object) per line, whose fields the spec maps by key (data.prompt_key, ...).
// A text field is a string or a conversation: a list of messages, each an
// object with a "role" (string) and a "content" (a string, null, or a list
// of parts); other fields of a message (tool calls, names, reasoning) pass
// through to the chat template untouched.
#ifndef STRATA_POLICIES_DATA_DATASET_H_
#define STRATA_POLICIES_DATA_DATASET_H_

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace strata::policies {

// One line of a dataset: a JSON object, and where it came from.
struct Record {
  nlohmann::ordered_json fields;
  std::string where;  // "path:line", for errors
};

// The records of the JSONL file at `path`, in file order; blank lines are
// skipped. Errors: the file's own (NOT_FOUND, ...), INVALID_ARGUMENT naming
// path:line for a line that is not a JSON object, or naming the path when the
// file holds no record at all.
absl::StatusOr<std::vector<Record>> ReadJsonl(const std::string& path);

// A text field's value: a string, or a conversation.
struct TextValue {
  std::string text;                           // when a string
  nlohmann::ordered_json messages = nullptr;  // when a conversation: a JSON array
  bool is_conversation() const { return messages.is_array(); }
};

// record.fields[key] as a TextValue; std::nullopt when absent or null.
// INVALID_ARGUMENT "path:line: key 'k' ..." when it is neither a string nor a
// well-formed conversation (naming the message and what is wrong with it).
absl::StatusOr<std::optional<TextValue>> ReadText(const Record& record, const std::string& key);
// The same, but absence is INVALID_ARGUMENT "path:line: key 'k' is missing".
absl::StatusOr<TextValue> RequireText(const Record& record, const std::string& key);
// A label (data.label_key): a string, or a number or boolean as its JSON
// text ("42", "0.5", "true"); "" when `key` is empty. INVALID_ARGUMENT naming
// path:line and the key when absent or of another type.
absl::StatusOr<std::string> ReadLabel(const Record& record, const std::string& key);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DATA_DATASET_H_
