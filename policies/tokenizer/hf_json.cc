#include "policies/tokenizer/hf_json.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::policies::internal {

void Fail(std::string message) { throw SchemaError{std::move(message)}; }

void Unsupported(const std::string& where, const std::string& type) {
  Fail(absl::StrCat("unsupported ", where, " type \"", type, "\""));
}

const Json* Find(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

const Json& Require(const Json& obj, const char* key, const std::string& where) {
  const Json* value = Find(obj, key);
  if (value == nullptr) Fail(absl::StrCat(where, " has no \"", key, "\""));
  return *value;
}

std::string RequireString(const Json& obj, const char* key, const std::string& where) {
  const Json& value = Require(obj, key, where);
  if (!value.is_string()) Fail(absl::StrCat(where, ".", key, " must be a string"));
  return value.get<std::string>();
}

bool OptionalBool(const Json& obj, const char* key, bool default_value, const std::string& where) {
  const Json* value = Find(obj, key);
  if (value == nullptr) return default_value;
  if (!value->is_boolean()) Fail(absl::StrCat(where, ".", key, " must be a boolean"));
  return value->get<bool>();
}

std::string TypeOf(const Json& component, const std::string& where) {
  if (!component.is_object()) Fail(absl::StrCat(where, " must be an object"));
  return RequireString(component, "type", where);
}

std::string StringPattern(const Json& component, const std::string& where) {
  const Json& pattern = Require(component, "pattern", where);
  if (const Json* s = Find(pattern, "String"); s != nullptr && s->is_string()) {
    return s->get<std::string>();
  }
  Fail(absl::StrCat(where, ".pattern: only {\"String\": ...} patterns are supported, got ", pattern.dump()));
}

int32_t CheckedId(const Json& value, const std::string& where) {
  if (!value.is_number_integer()) Fail(absl::StrCat(where, " must be an integer id"));
  const auto id = value.get<int64_t>();
  if (id < 0 || id >= INT32_MAX) Fail(absl::StrCat(where, " is out of range: ", id));
  return static_cast<int32_t>(id);
}

}  // namespace strata::policies::internal
