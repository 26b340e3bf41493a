// A SentencePiece `tokenizer.model` reader and encoder / decoder that matches
// the reference spm_encode / spm_decode (sentencepiece 0.1.97) without linking
// libsentencepiece or protobuf: the ModelProto wire format is parsed by hand.
//
// Supported: BPE and Unigram models (WORD and CHAR too), byte fallback,
// user-defined symbols, the precompiled normalization charsmap (nmt_nfkc,
// nfkc, identity, custom TSV rules compiled by spm_train), add_dummy_prefix,
// remove_extra_whitespaces, escape_whitespaces, treat_whitespace_as_suffix.
// Not supported: sampling / n-best encoding and the denormalizer spec.
#ifndef STRATA_POLICIES_TOKENIZER_SENTENCEPIECE_MODEL_H_
#define STRATA_POLICIES_TOKENIZER_SENTENCEPIECE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/tokenizer/tokenizer.h"

namespace strata::policies {

// The parts of sentencepiece's ModelProto (sentencepiece_model.proto) that
// encoding and decoding need, with the proto2 defaults.
struct SentencePieceModelProto {
  // ModelProto.SentencePiece.Type.
  enum class PieceType : int32_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
  };
  // TrainerSpec.ModelType.
  enum class ModelType : int32_t { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };

  struct Piece {
    std::string piece;
    float score = 0.0f;
    PieceType type = PieceType::kNormal;
  };

  std::vector<Piece> pieces;  // index == token id

  // TrainerSpec (field 2).
  ModelType model_type = ModelType::kUnigram;
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  int32_t unk_id = 0;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  int32_t pad_id = -1;
  std::string unk_piece = "<unk>";
  std::string bos_piece = "<s>";
  std::string eos_piece = "</s>";
  std::string pad_piece = "<pad>";
  std::string unk_surface = " \xE2\x81\x87 ";  // " ⁇ ", what <unk> decodes to

  // NormalizerSpec (field 3).
  std::string normalizer_name;
  std::string precompiled_charsmap;  // darts-clone trie + NUL-terminated strings
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// Parses serialized ModelProto bytes. Unknown fields of every wire type are
// skipped. INVALID_ARGUMENT naming `source` for truncated or malformed input
// (bad varints, lengths past the end, wrong wire types for known fields,
// unknown enum values). Does not check the vocabulary; see
// SentencePieceTokenizer::FromProto.
absl::StatusOr<SentencePieceModelProto> ParseSentencePieceModelProto(std::string_view bytes, const std::string& source);

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Reads and parses `path` (a tokenizer.model). NOT_FOUND when it does not
  // exist, INVALID_ARGUMENT naming it when it is not a usable model.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromFile(const std::string& path);
  // Validates the vocabulary the way sentencepiece does (non-empty unique
  // pieces, exactly one <unk>, all 256 byte pieces iff byte_fallback, a valid
  // charsmap); errors name `source`. add_bos() starts true.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromProto(SentencePieceModelProto proto,
                                                                           const std::string& source);

  ~SentencePieceTokenizer() override;

  std::vector<int32_t> Encode(const std::string& text) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  int32_t PieceToId(const std::string& piece) const override;
  std::string IdToPiece(int32_t id) const override;

  // The text the model segments: `text` after the charsmap, whitespace
  // handling and U+2581 escaping (what spm_normalize prints).
  std::string Normalize(std::string_view text) const;

  const SentencePieceModelProto& proto() const { return proto_; }

 protected:
  void ApplyConfig(const TokenizerConfig& config) override;

 private:
  class CharsMap;
  class PieceTrie;
  struct Result {
    std::string_view piece;  // points into the normalized text
    int32_t id;
  };

  explicit SentencePieceTokenizer(SentencePieceModelProto proto);
  absl::Status Init(const std::string& source);

  // Piece lookup as sentencepiece's ModelInterface::PieceToId: control,
  // unknown and byte pieces first, then the rest; unk_id_ when absent.
  int32_t LookupOrUnk(std::string_view piece) const;
  // Normal, user-defined and unused pieces only (what the segmenters may
  // produce); -1 when absent.
  int32_t LookupNormal(std::string_view piece) const;
  // Byte length of the longest user-defined symbol at the start of `text`.
  size_t MatchUserDefined(std::string_view text) const;
  // Normalization of the character(s) at the start of `input`: the
  // replacement text and how many input bytes it consumes.
  std::pair<std::string_view, size_t> NormalizePrefix(std::string_view input) const;

  std::vector<Result> EncodeBpe(std::string_view normalized) const;
  std::vector<Result> EncodeUnigram(std::string_view normalized) const;
  std::vector<Result> EncodeWord(std::string_view normalized) const;
  std::vector<Result> EncodeChar(std::string_view normalized) const;

  bool IsType(int32_t id, SentencePieceModelProto::PieceType type) const;

  SentencePieceModelProto proto_;
  std::unique_ptr<CharsMap> charsmap_;            // null for identity normalization
  std::unique_ptr<PieceTrie> normal_trie_;        // normal + user-defined + unused
  std::unique_ptr<PieceTrie> user_defined_trie_;  // user-defined symbols only
  // Keys point into proto_.pieces, which never changes after Init.
  std::unordered_map<std::string_view, int32_t> normal_pieces_;
  std::unordered_map<std::string_view, int32_t> reserved_pieces_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> ids when byte_fallback
  std::vector<int16_t> byte_values_;     // per id: the byte of a <0xNN> piece, else -1
  float min_score_ = 0.0f;               // over NORMAL pieces: unigram unknown penalty
  float max_score_ = 0.0f;               // max(FLT_MIN, NORMAL scores), or 0: user-defined bonus
  int32_t unk_id_ = -1;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t pad_id_ = -1;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TOKENIZER_SENTENCEPIECE_MODEL_H_
