// The two tries behind SentencePieceTokenizer (its private nested classes):
// the precompiled normalization charsmap, and the piece trie the segmenters
// search. Private to policies/tokenizer.
#ifndef STRATA_POLICIES_TOKENIZER_SENTENCEPIECE_TRIES_H_
#define STRATA_POLICIES_TOKENIZER_SENTENCEPIECE_TRIES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/tokenizer/sentencepiece_model.h"

namespace strata::policies {

// The precompiled normalization rules: a darts-clone double-array trie over
// the UTF-8 of the source strings whose leaves hold offsets of NUL-terminated
// replacement strings. Layout: little-endian uint32 trie size in bytes, the
// trie units, then the replacement strings.
class SentencePieceTokenizer::CharsMap {
 public:
  // INVALID_ARGUMENT naming `source` when the blob is too short for its
  // declared trie size.
  static absl::StatusOr<std::unique_ptr<CharsMap>> Create(std::string_view blob, const std::string& source);

  // The replacement of the longest rule matching a prefix of `input` and the
  // bytes it consumes; {"", 0} when no rule matches.
  std::pair<std::string_view, size_t> LongestMatch(std::string_view input) const;

 private:
  CharsMap() = default;
  static size_t Offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }

  std::vector<uint32_t> units_;
  std::string strings_;
};

// A byte trie over piece strings, for the prefix searches of the unigram
// lattice and the user-defined symbol matcher.
class SentencePieceTokenizer::PieceTrie {
 public:
  PieceTrie() : values_(1, -1) {}

  void Insert(std::string_view key, int32_t value);

  // Calls fn(length, value) for each key that is a prefix of `text`, shortest
  // first (the order darts-clone's traverse reports them in).
  template <typename Fn>
  void ForEachPrefix(std::string_view text, Fn&& fn) const {
    uint32_t node = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]);
      const auto it = edges_.find(edge);
      if (it == edges_.end()) return;
      node = it->second;
      if (values_[node] >= 0) fn(i + 1, values_[node]);
    }
  }

  bool empty() const { return edges_.empty(); }

 private:
  std::unordered_map<uint64_t, uint32_t> edges_;  // (node << 8 | byte) -> child
  std::vector<int32_t> values_;                   // per node; -1 if no key ends here
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TOKENIZER_SENTENCEPIECE_TRIES_H_
