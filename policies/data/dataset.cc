#include "policies/data/dataset.h"

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"

namespace strata::policies {
namespace {

using Json = nlohmann::ordered_json;

absl::Status KeyError(const Record& record, const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(record.where, ": key '", key, "' ", why));
}

absl::Status CheckConversation(const Record& record, const std::string& key, const Json& messages) {
  if (messages.empty()) return KeyError(record, key, "is an empty conversation");
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string which = absl::StrCat("message ", i);
    if (!m.is_object()) return KeyError(record, key, absl::StrCat(which, " is not an object"));
    if (!m.contains("role") || !m["role"].is_string()) {
      return KeyError(record, key, absl::StrCat(which, " has no \"role\" string"));
    }
    if (!m.contains("content")) return KeyError(record, key, absl::StrCat(which, " has no \"content\""));
    const Json& content = m["content"];
    if (!content.is_string() && !content.is_null() && !content.is_array()) {
      return KeyError(record, key, absl::StrCat(which, "'s \"content\" is not a string, null or a list of parts"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Record>> ReadJsonl(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
  std::vector<Record> rows;
  size_t start = 0;
  for (int line = 1; start < text.size(); ++line) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view row(text.data() + start, end - start);
    start = end + 1;
    if (row.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j = Json::parse(row, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": not a JSON object"));
    }
    rows.push_back({std::move(j), absl::StrCat(path, ":", line)});
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  return rows;
}

absl::StatusOr<std::optional<TextValue>> ReadText(const Record& record, const std::string& key) {
  const auto it = record.fields.find(key);
  if (it == record.fields.end() || it->is_null()) return std::nullopt;
  TextValue value;
  if (it->is_string()) {
    value.text = it->get<std::string>();
  } else if (it->is_array()) {
    STRATA_RETURN_IF_ERROR(CheckConversation(record, key, *it));
    value.messages = *it;
  } else {
    return KeyError(record, key, "must be a string or a conversation (a list of {\"role\", \"content\"} messages)");
  }
  return value;
}

absl::StatusOr<TextValue> RequireText(const Record& record, const std::string& key) {
  STRATA_ASSIGN_OR_RETURN(auto value, ReadText(record, key));
  if (!value.has_value()) return KeyError(record, key, "is missing");
  return *std::move(value);
}

absl::StatusOr<std::string> ReadLabel(const Record& record, const std::string& key) {
  if (key.empty()) return std::string();
  const auto it = record.fields.find(key);
  if (it == record.fields.end() || it->is_null()) return KeyError(record, key, "(the label) is missing");
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number() || it->is_boolean()) return it->dump();
  return KeyError(record, key, "(the label) must be a string or a number");
}

}  // namespace strata::policies
