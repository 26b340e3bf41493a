// A Hugging Face `tokenizer.json` reader for BPE models, covering the two
// styles Llama-family checkpoints ship:
//  - SentencePiece-converted BPE with byte fallback (Llama-2, Mistral):
//    normalizer Sequence[Prepend("▁"), Replace(" ", "▁")] or a Metaspace
//    pre-tokenizer, `<0xNN>` byte pieces, decoder
//    Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)];
//  - byte-level BPE (GPT-2, Llama-3): ByteLevel / Split(regex) pre-tokenizers
//    and the ByteLevel decoder.
//
// Components implemented (anything else is INVALID_ARGUMENT naming the type):
//  normalizer:    Sequence, Prepend, Replace (string pattern), Strip, NFC, NFD, NFKC,
//                 NFKD, Lowercase (ICU)
//  pre_tokenizer: Sequence, ByteLevel (add_prefix_space, use_regex),
//                 Split (string pattern, or one of the regexes listed in
//                 policies/tokenizer/unicode.h: GPT-2, Llama-3 / cl100k, Qwen2),
//                 Metaspace, Digits
//  model:         BPE (vocab, merges as "a b" or ["a", "b"], byte_fallback,
//                 unk_token, fuse_unk, ignore_merges,
//                 continuing_subword_prefix, end_of_word_suffix)
//  decoder:       Sequence, ByteLevel, Replace (string pattern), ByteFallback,
//                 Fuse, Strip, Metaspace
//  post_processor (only to learn BOS / EOS): TemplateProcessing, Sequence,
//                 ByteLevel, RobertaProcessing, BertProcessing
//
// Added tokens are matched literally (leftmost-longest, honouring lstrip,
// rstrip and single_word) in the raw text before normalization, for
// "normalized": true tokens too; Hugging Face matches those after
// normalization, which only differs when the normalizer changes the token.
#ifndef STRATA_POLICIES_TOKENIZER_BPE_TOKENIZER_H_
#define STRATA_POLICIES_TOKENIZER_BPE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/tokenizer/tokenizer.h"

namespace strata::policies {

class HfBpeTokenizer final : public Tokenizer {
 public:
  // Reads `path` (a tokenizer.json). NOT_FOUND when it does not exist,
  // INVALID_ARGUMENT naming it when it is malformed or uses an unsupported
  // component.
  static absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> FromFile(const std::string& path);
  // Same, from the JSON text; errors name `source`.
  static absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> FromJson(const std::string& json_text,
                                                                  const std::string& source);

  ~HfBpeTokenizer() override;

  // Added tokens in `text` (special ones included, as Hugging Face does by
  // default) become their ids; the rest goes through normalizer,
  // pre-tokenizer and BPE. No post-processor tokens are added.
  std::vector<int32_t> Encode(const std::string& text) const override;
  // Special added tokens are skipped (skip_special_tokens=True); the rest
  // goes through the decoder chain (no decoder: tokens joined by spaces, as
  // Hugging Face does).
  std::string Decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override;
  // From tokenizer_config.json when it names them, else from the
  // post_processor template, else the first present of the usual names
  // ("<s>" / "<|begin_of_text|>" / ..., "</s>" / "<|end_of_text|>" / ...,
  // "<pad>" / "<|pad|>"); -1 when none.
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  int32_t pad_id() const override;
  int32_t PieceToId(const std::string& piece) const override;
  std::string IdToPiece(int32_t id) const override;

 protected:
  void ApplyConfig(const TokenizerConfig& config) override;

 private:
  struct Impl;
  explicit HfBpeTokenizer(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TOKENIZER_BPE_TOKENIZER_H_
