// Reading Hugging Face `tokenizer.json`: the field accessors every component
// parser uses. Private to policies/tokenizer (HfBpeTokenizer and its parts).
//
// Reading tokenizer.json is a deep walk over optional fields, so problems are
// reported by throwing SchemaError (or nlohmann's type errors);
// HfBpeTokenizer::FromJson is the one place that turns both into
// INVALID_ARGUMENT. Neither escapes the library.
#ifndef STRATA_POLICIES_TOKENIZER_HF_JSON_H_
#define STRATA_POLICIES_TOKENIZER_HF_JSON_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata::policies::internal {

using Json = nlohmann::json;

struct SchemaError {
  std::string message;
};

[[noreturn]] void Fail(std::string message);
// "unsupported <where> type "<type>"".
[[noreturn]] void Unsupported(const std::string& where, const std::string& type);

// Member `key` of object `obj`, or nullptr when absent or null.
const Json* Find(const Json& obj, const char* key);
// `where` names `obj` in the error (e.g. "normalizer.normalizers[1]").
const Json& Require(const Json& obj, const char* key, const std::string& where);
std::string RequireString(const Json& obj, const char* key, const std::string& where);
bool OptionalBool(const Json& obj, const char* key, bool default_value, const std::string& where);
// The "type" of a component object.
std::string TypeOf(const Json& component, const std::string& where);
// {"String": " "} -> " ". Regex patterns are only supported where a
// recognized pre-tokenizer regex is expected, so they fail here.
std::string StringPattern(const Json& component, const std::string& where);
// A token id: an integer in [0, INT32_MAX).
int32_t CheckedId(const Json& value, const std::string& where);

// A component of type "Sequence" holds its members in the array `list_key`:
// then parses each, in order, with parse(member, where_of_member, out) and
// returns true. False (and no call) for any other type.
template <typename Out>
bool ExpandSequence(const Json& component, const std::string& type, const char* list_key, const std::string& where,
                    void (*parse)(const Json&, const std::string&, Out*), Out* out) {
  if (type != "Sequence") return false;
  const Json& list = Require(component, list_key, where);
  if (!list.is_array()) Fail(absl::StrCat(where, ".", list_key, " must be an array"));
  for (size_t i = 0; i < list.size(); ++i) {
    parse(list[i], absl::StrCat(where, ".", list_key, "[", i, "]"), out);
  }
  return true;
}

}  // namespace strata::policies::internal

#endif  // STRATA_POLICIES_TOKENIZER_HF_JSON_H_
