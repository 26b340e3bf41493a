#include "policies/data/dataset.h"

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"

namespace strata::policies {

absl::StatusOr<std::vector<Record>> ReadJsonl(const std::string& path, const std::vector<std::string>& fields) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
  std::vector<Record> rows;
  size_t start = 0;
  for (int line = 1; start < text.size(); ++line) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string row = text.substr(start, end - start);
    start = end + 1;
    if (row.find_first_not_of(" \t\r") == std::string::npos) continue;
    Record j = Record::parse(row, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": not a JSON object"));
    }
    for (const auto& f : fields) {
      if (!j.contains(f) || !j[f].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": field '", f, "' (a string) is missing"));
      }
    }
    rows.push_back(std::move(j));
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  return rows;
}

}  // namespace strata::policies
