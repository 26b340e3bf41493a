// The "model" of a tokenizer.json of type BPE: vocabulary, ranked merges and
// the unknown-character rules, applied to one pre-tokenized word at a time as
// Hugging Face's BPE model does. Private to policies/tokenizer.
#ifndef STRATA_POLICIES_TOKENIZER_HF_BPE_MODEL_H_
#define STRATA_POLICIES_TOKENIZER_HF_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "policies/tokenizer/hf_json.h"

namespace strata::policies::internal {

struct BpeModel {
  std::unordered_map<std::string, int32_t> vocab;
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  std::array<int32_t, 256> byte_ids{};  // <0xNN> ids, -1 when absent

  // Appends the ids of one pre-tokenized word.
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;

 private:
  const std::pair<int32_t, int32_t>* FindMerge(int32_t left, int32_t right) const {
    const auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
                                static_cast<uint32_t>(right));
    return it == merges.end() ? nullptr : &it->second;
  }
};

// Reads tokenizer.json's "model" into `bpe`; throws SchemaError (hf_json.h)
// for another model type, dropout, or a vocab / merges entry that does not
// resolve.
void ParseBpeModel(const Json& model, BpeModel* bpe);

}  // namespace strata::policies::internal

#endif  // STRATA_POLICIES_TOKENIZER_HF_BPE_MODEL_H_
