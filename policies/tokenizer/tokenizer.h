// Text <-> token ids for the policies, without libsentencepiece or the Hugging
// Face tokenizers library. Two implementations sit behind one interface:
//  - SentencePieceTokenizer (policies/tokenizer/sentencepiece_model.h) reads a
//    `tokenizer.model` protobuf and matches spm_encode / spm_decode;
//  - HfBpeTokenizer (policies/tokenizer/bpe_tokenizer.h) reads a Hugging Face
//    `tokenizer.json` with a BPE model (Llama-2 byte fallback, GPT-2 / Llama-3
//    byte-level).
// Tokenizer::Load picks the right one for a model directory or file.
//
// Thread-safety: a loaded tokenizer is immutable; all const methods may be
// called concurrently. The set_add_* setters are not synchronized: call them
// before sharing the tokenizer.
#ifndef STRATA_POLICIES_TOKENIZER_TOKENIZER_H_
#define STRATA_POLICIES_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::policies {

// The fields of a Hugging Face `tokenizer_config.json` the tokenizers use.
// Absent (or null) fields stay unset and leave the tokenizer's own defaults.
struct TokenizerConfig {
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  // Token strings; `"bos_token": {"content": "<s>", ...}` is accepted too.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
};

// Parses the text of a tokenizer_config.json. INVALID_ARGUMENT naming `path`
// (and the field) when the JSON is malformed or a used field has the wrong type.
absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(const std::string& json_text, const std::string& path);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // `path` is one of:
  //  - a model directory: uses tokenizer.json if present, else tokenizer.model;
  //    a tokenizer_config.json next to them sets add_bos_token / add_eos_token
  //    and the names of the bos / eos / pad tokens;
  //  - a tokenizer.json file (any name ending in ".json");
  //  - a tokenizer.model file (any other file).
  // Without a tokenizer_config.json (or when it does not say), a SentencePiece
  // model adds BOS (Llama-2 behaviour) and a tokenizer.json adds BOS exactly
  // when its post_processor template starts with a special token.
  // Errors name the file: NOT_FOUND when there is nothing to load,
  // INVALID_ARGUMENT for malformed or unsupported files.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  // Text -> ids with NO BOS/EOS added (like `spm_encode --output_format=id`).
  // Bytes that are not valid UTF-8 are treated as U+FFFD by SentencePiece
  // models (as sentencepiece does) and as raw bytes by byte-level BPE.
  virtual std::vector<int32_t> Encode(const std::string& text) const = 0;

  // Ids -> text like `spm_decode --input_format=id`: control / special tokens
  // (<s>, </s>, <|begin_of_text|>, ...) decode to nothing, byte pieces are
  // reassembled into UTF-8 and invalid UTF-8 becomes U+FFFD. Ids outside
  // [0, vocab_size()) (and unassigned ids) are skipped, never an error, so a
  // sampler's stray id cannot fail a rollout.
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;

  // One past the largest id the tokenizer can produce or decode.
  virtual int32_t vocab_size() const = 0;

  // Special token ids; -1 when the tokenizer has none.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;

  // The id of a vocabulary entry (as stored: "▁the", "<0x0A>", "Ġthe",
  // "<|eot_id|>"), or -1 when there is none. Useful for stop tokens.
  virtual int32_t PieceToId(const std::string& piece) const = 0;
  // The stored string of `id`; empty when out of range or unassigned.
  virtual std::string IdToPiece(int32_t id) const = 0;

  // Whether a prompt given as text starts with BOS (see Load) and whether the
  // model's config asks for EOS at the end of encoded sequences.
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  void set_add_bos(bool add_bos) { add_bos_ = add_bos; }
  void set_add_eos(bool add_eos) { add_eos_ = add_eos; }

  // What a prompt given as text gets: Encode(text), preceded by bos_id() when
  // add_bos() and the tokenizer has a BOS. Never appends EOS: the policy is
  // meant to continue the prompt.
  std::vector<int32_t> EncodeForPrompt(const std::string& text) const;

 protected:
  Tokenizer() = default;

  // Applies tokenizer_config.json: add_bos_token / add_eos_token when set.
  // Subclasses extend this to resolve the bos / eos / pad token names.
  virtual void ApplyConfig(const TokenizerConfig& config);

 private:
  bool add_bos_ = false;
  bool add_eos_ = false;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TOKENIZER_TOKENIZER_H_
