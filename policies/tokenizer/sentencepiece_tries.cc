#include "policies/tokenizer/sentencepiece_tries.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata::policies {

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer::CharsMap>> SentencePieceTokenizer::CharsMap::Create(
    std::string_view blob, const std::string& source) {
  if (blob.size() <= 4) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": precompiled_charsmap is truncated"));
  }
  uint32_t trie_bytes = 0;
  for (int i = 3; i >= 0; --i) trie_bytes = (trie_bytes << 8) | static_cast<uint8_t>(blob[i]);
  if (trie_bytes >= blob.size() || trie_bytes < 4 || blob.size() - 4 < trie_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": precompiled_charsmap has an invalid trie size"));
  }
  auto map = std::unique_ptr<CharsMap>(new CharsMap);
  map->units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < map->units_.size(); ++i) {
    uint32_t u = 0;
    for (int k = 3; k >= 0; --k) u = (u << 8) | static_cast<uint8_t>(blob[4 + i * 4 + k]);
    map->units_[i] = u;
  }
  const std::string_view strings = blob.substr(4 + trie_bytes);
  map->strings_.assign(strings.data(), strings.size());
  return map;
}

std::pair<std::string_view, size_t> SentencePieceTokenizer::CharsMap::LongestMatch(std::string_view input) const {
  size_t best_length = 0;
  uint32_t best_value = 0;
  size_t id = Offset(units_[0]);
  for (size_t i = 0; i < input.size(); ++i) {
    const auto c = static_cast<uint8_t>(input[i]);
    id ^= c;
    if (id >= units_.size()) break;
    const uint32_t unit = units_[id];
    // The label includes the leaf flag (bit 31), so leaf units never match.
    if ((unit & 0x800000FFu) != c) break;
    id ^= Offset(unit);
    if (((unit >> 8) & 1) != 0 && id < units_.size()) {
      best_length = i + 1;
      best_value = units_[id] & 0x7FFFFFFFu;
    }
  }
  if (best_length == 0 || best_value >= strings_.size()) return {std::string_view(), 0};
  const char* begin = strings_.data() + best_value;
  const size_t max_len = strings_.size() - best_value;
  return {std::string_view(begin, strnlen(begin, max_len)), best_length};
}

void SentencePieceTokenizer::PieceTrie::Insert(std::string_view key, int32_t value) {
  uint32_t node = 0;
  for (char ch : key) {
    const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(ch);
    auto it = edges_.find(edge);
    if (it == edges_.end()) {
      it = edges_.emplace(edge, static_cast<uint32_t>(values_.size())).first;
      values_.push_back(-1);
    }
    node = it->second;
  }
  values_[node] = value;
}

}  // namespace strata::policies
