#include "rewards/verifiers/rule_rewards.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"

namespace strata::rewards {

absl::StatusOr<RuleFn> MakeRule(const std::string& name) {
  if (name == "vowel_fraction") {
    return RuleFn([](const std::string&, const std::string& response) {
      int letters = 0, vowels = 0;
      for (unsigned char c : response) {
        if (!std::isalpha(c)) continue;
        ++letters;
        const char lower = static_cast<char>(std::tolower(c));
        vowels += lower == 'a' || lower == 'e' || lower == 'i' || lower == 'o' || lower == 'u';
      }
      return letters == 0 ? 0.0 : static_cast<double>(vowels) / letters;
    });
  }
  if (name == "length_ratio") {
    return RuleFn([](const std::string&, const std::string& response) {
      return std::min(1.0, static_cast<double>(response.size()) / 32.0);
    });
  }
  if (name.rfind("contains:", 0) == 0 && name.size() > 9) {
    const std::string word = name.substr(9);
    return RuleFn([word](const std::string&, const std::string& response) {
      return response.find(word) != std::string::npos ? 1.0 : 0.0;
    });
  }
  return absl::InvalidArgumentError(
      absl::StrCat("reward rule '", name, "' is unknown (vowel_fraction, length_ratio, contains:WORD)"));
}

}  // namespace strata::rewards
