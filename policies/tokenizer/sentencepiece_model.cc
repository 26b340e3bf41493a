#include "policies/tokenizer/sentencepiece_model.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/tokenizer/unicode.h"

namespace strata::policies {
namespace {

using PieceType = SentencePieceModelProto::PieceType;
using ModelType = SentencePieceModelProto::ModelType;

// U+2581 LOWER ONE EIGHTH BLOCK, sentencepiece's visible whitespace.
constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";
// What a unigram lattice charges for a character no piece covers, below the
// worst piece score (sentencepiece's kUnkPenalty).
constexpr float kUnkPenalty = 10.0f;

// ---------------------------------------------------------------------------
// Protobuf wire format. Only what ModelProto needs: varints, 32/64-bit fixed,
// length-delimited fields, and skipping groups of unknown fields.

enum WireType : int {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5
};

class WireReader {
 public:
  // `base` is the offset of `data` in the file, so errors point at the byte.
  WireReader(std::string_view data, size_t base) : data_(data), base_(base) {}

  bool AtEnd() const { return pos_ >= data_.size(); }
  const std::string& error() const { return error_; }

  bool ReadTag(uint32_t* field, int* wire_type) {
    uint64_t tag = 0;
    if (!ReadVarint(&tag)) return false;
    *field = static_cast<uint32_t>(tag >> 3);
    *wire_type = static_cast<int>(tag & 7);
    if (*field == 0 || tag >> 32 != 0) return Fail("invalid field number");
    if (*wire_type > kFixed32) return Fail(absl::StrCat("invalid wire type ", *wire_type));
    return true;
  }

  bool ReadVarint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return Fail("truncated varint");
      const auto b = static_cast<uint8_t>(data_[pos_++]);
      result |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return Fail("varint longer than 10 bytes");
  }

  bool ReadFixed32(uint32_t* value) {
    if (data_.size() - pos_ < 4) return Fail("truncated fixed32");
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(data_[pos_ + i]);
    pos_ += 4;
    *value = v;
    return true;
  }

  // A length-delimited payload, and the file offset where it starts.
  bool ReadBytes(std::string_view* bytes, size_t* offset) {
    uint64_t length = 0;
    if (!ReadVarint(&length)) return false;
    if (length > data_.size() - pos_) return Fail("length-delimited field runs past the end");
    *offset = base_ + pos_;
    *bytes = data_.substr(pos_, static_cast<size_t>(length));
    pos_ += static_cast<size_t>(length);
    return true;
  }

  // Skips the payload of a field whose tag was just read.
  bool Skip(uint32_t field, int wire_type, int depth = 0) {
    uint64_t ignored64 = 0;
    uint32_t ignored32 = 0;
    std::string_view ignored_bytes;
    size_t ignored_offset = 0;
    switch (wire_type) {
      case kVarint:
        return ReadVarint(&ignored64);
      case kFixed64:
        if (data_.size() - pos_ < 8) return Fail("truncated fixed64");
        pos_ += 8;
        return true;
      case kLengthDelimited:
        return ReadBytes(&ignored_bytes, &ignored_offset);
      case kFixed32:
        return ReadFixed32(&ignored32);
      case kStartGroup: {
        if (depth > 64) return Fail("groups nested too deeply");
        while (true) {
          if (AtEnd()) return Fail("unterminated group");
          uint32_t inner_field = 0;
          int inner_type = 0;
          if (!ReadTag(&inner_field, &inner_type)) return false;
          if (inner_type == kEndGroup) {
            return inner_field == field ? true : Fail("mismatched end of group");
          }
          if (!Skip(inner_field, inner_type, depth + 1)) return false;
        }
      }
      default:
        return Fail("unexpected end of group");
    }
  }

  bool Fail(const std::string& what) {
    if (error_.empty()) error_ = absl::StrCat(what, " at byte ", base_ + pos_);
    return false;
  }

 private:
  std::string_view data_;
  size_t base_;
  size_t pos_ = 0;
  std::string error_;
};

// Readers for the typed fields of a message. Each checks the wire type, since
// a mismatch means the bytes are not the message we think they are.
class MessageParser {
 public:
  explicit MessageParser(WireReader* reader) : r_(reader) {}

  bool Expect(uint32_t field, int wire_type, int expected) {
    if (wire_type == expected) return true;
    return r_->Fail(
        absl::StrCat("field ", field, " has wire type ", wire_type, ", expected ", expected));
  }
  bool Varint(uint32_t field, int wire_type, uint64_t* value) {
    return Expect(field, wire_type, kVarint) && r_->ReadVarint(value);
  }
  bool Bool(uint32_t field, int wire_type, bool* value) {
    uint64_t v = 0;
    if (!Varint(field, wire_type, &v)) return false;
    *value = v != 0;
    return true;
  }
  bool Int32(uint32_t field, int wire_type, int32_t* value) {
    uint64_t v = 0;
    if (!Varint(field, wire_type, &v)) return false;
    // int32 fields are sign-extended to 64 bits on the wire; keep the low half.
    *value = static_cast<int32_t>(static_cast<uint32_t>(v));
    return true;
  }
  bool Float(uint32_t field, int wire_type, float* value) {
    uint32_t bits = 0;
    if (!Expect(field, wire_type, kFixed32) || !r_->ReadFixed32(&bits)) return false;
    *value = std::bit_cast<float>(bits);
    return true;
  }
  bool Bytes(uint32_t field, int wire_type, std::string_view* value, size_t* offset) {
    return Expect(field, wire_type, kLengthDelimited) && r_->ReadBytes(value, offset);
  }
  bool String(uint32_t field, int wire_type, std::string* value) {
    std::string_view bytes;
    size_t offset = 0;
    if (!Bytes(field, wire_type, &bytes, &offset)) return false;
    value->assign(bytes.data(), bytes.size());
    return true;
  }

 private:
  WireReader* r_;
};

// Reads the fields of one message from `bytes`, handing each to
// `on_field(reader, parser, field, wire_type)`, which returns false on a bad
// field (after reader.Fail, or a parser call that failed). False, with the
// reader's error in *error, when the message is malformed.
template <typename OnField>
bool ParseFields(std::string_view bytes, size_t base, std::string* error, OnField on_field) {
  WireReader r(bytes, base);
  MessageParser p(&r);
  while (!r.AtEnd()) {
    uint32_t field = 0;
    int wt = 0;
    if (!r.ReadTag(&field, &wt) || !on_field(r, p, field, wt)) break;
  }
  *error = r.error();
  return error->empty();
}

bool ParsePiece(std::string_view bytes, size_t base, SentencePieceModelProto::Piece* piece,
                std::string* error) {
  return ParseFields(bytes, base, error, [piece](WireReader& r, MessageParser& p, uint32_t field, int wt) {
    switch (field) {
      case 1:
        return p.String(field, wt, &piece->piece);
      case 2:
        return p.Float(field, wt, &piece->score);
      case 3: {
        int32_t type = 0;
        if (!p.Int32(field, wt, &type)) return false;
        if (type < 1 || type > 6) return r.Fail(absl::StrCat("unknown piece type ", type));
        piece->type = static_cast<PieceType>(type);
        return true;
      }
      default:
        return r.Skip(field, wt);
    }
  });
}

bool ParseTrainerSpec(std::string_view bytes, size_t base, SentencePieceModelProto* m,
                      std::string* error) {
  return ParseFields(bytes, base, error, [m](WireReader& r, MessageParser& p, uint32_t field, int wt) {
    switch (field) {
      case 3: {
        int32_t type = 0;
        if (!p.Int32(field, wt, &type)) return false;
        if (type < 1 || type > 4) return r.Fail(absl::StrCat("unknown model_type ", type));
        m->model_type = static_cast<ModelType>(type);
        return true;
      }
      case 24:
        return p.Bool(field, wt, &m->treat_whitespace_as_suffix);
      case 35:
        return p.Bool(field, wt, &m->byte_fallback);
      case 40:
        return p.Int32(field, wt, &m->unk_id);
      case 41:
        return p.Int32(field, wt, &m->bos_id);
      case 42:
        return p.Int32(field, wt, &m->eos_id);
      case 43:
        return p.Int32(field, wt, &m->pad_id);
      case 44:
        return p.String(field, wt, &m->unk_surface);
      case 45:
        return p.String(field, wt, &m->unk_piece);
      case 46:
        return p.String(field, wt, &m->bos_piece);
      case 47:
        return p.String(field, wt, &m->eos_piece);
      case 48:
        return p.String(field, wt, &m->pad_piece);
      default:
        return r.Skip(field, wt);
    }
  });
}

bool ParseNormalizerSpec(std::string_view bytes, size_t base, SentencePieceModelProto* m,
                         std::string* error) {
  return ParseFields(bytes, base, error, [m](WireReader& r, MessageParser& p, uint32_t field, int wt) {
    switch (field) {
      case 1:
        return p.String(field, wt, &m->normalizer_name);
      case 2:
        return p.String(field, wt, &m->precompiled_charsmap);
      case 3:
        return p.Bool(field, wt, &m->add_dummy_prefix);
      case 4:
        return p.Bool(field, wt, &m->remove_extra_whitespaces);
      case 5:
        return p.Bool(field, wt, &m->escape_whitespaces);
      default:
        return r.Skip(field, wt);
    }
  });
}

// "<0x41>" -> 0x41; -1 when `piece` is not a byte piece.
int PieceToByte(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

}  // namespace

absl::StatusOr<SentencePieceModelProto> ParseSentencePieceModelProto(std::string_view bytes,
                                                                     const std::string& source) {
  SentencePieceModelProto model;
  WireReader r(bytes, 0);
  MessageParser p(&r);
  std::string error;
  bool ok = true;
  while (ok && !r.AtEnd()) {
    uint32_t field = 0;
    int wt = 0;
    if (!r.ReadTag(&field, &wt)) break;
    std::string_view sub;
    size_t offset = 0;
    switch (field) {
      case 1:
        ok = p.Bytes(field, wt, &sub, &offset);
        if (ok) {
          model.pieces.emplace_back();
          ok = ParsePiece(sub, offset, &model.pieces.back(), &error);
        }
        break;
      case 2:
        ok = p.Bytes(field, wt, &sub, &offset) && ParseTrainerSpec(sub, offset, &model, &error);
        break;
      case 3:
        ok = p.Bytes(field, wt, &sub, &offset) && ParseNormalizerSpec(sub, offset, &model, &error);
        break;
      default:
        ok = r.Skip(field, wt);
    }
  }
  if (error.empty()) error = r.error();
  if (!error.empty()) {
    return Invalid(source, absl::StrCat("not a valid SentencePiece model: ", error));
  }
  return model;
}

// ---------------------------------------------------------------------------
// The precompiled normalization rules: a darts-clone double-array trie over
// the UTF-8 of the source strings whose leaves hold offsets of NUL-terminated
// replacement strings. Layout: little-endian uint32 trie size in bytes, the
// trie units, then the replacement strings.
class SentencePieceTokenizer::CharsMap {
 public:
  static absl::StatusOr<std::unique_ptr<CharsMap>> Create(std::string_view blob,
                                                          const std::string& source) {
    if (blob.size() <= 4) return Invalid(source, "precompiled_charsmap is truncated");
    uint32_t trie_bytes = 0;
    for (int i = 3; i >= 0; --i) trie_bytes = (trie_bytes << 8) | static_cast<uint8_t>(blob[i]);
    if (trie_bytes >= blob.size() || trie_bytes < 4 || blob.size() - 4 < trie_bytes) {
      return Invalid(source, "precompiled_charsmap has an invalid trie size");
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

  // The replacement of the longest rule matching a prefix of `input` and the
  // bytes it consumes; {"", 0} when no rule matches.
  std::pair<std::string_view, size_t> LongestMatch(std::string_view input) const {
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

  void Insert(std::string_view key, int32_t value) {
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

// ---------------------------------------------------------------------------

SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceModelProto proto)
    : proto_(std::move(proto)) {
  set_add_bos(true);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromFile(
    const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto bytes, ReadFileToString(path));
  STRATA_ASSIGN_OR_RETURN(auto proto, ParseSentencePieceModelProto(bytes, path));
  return FromProto(std::move(proto), path);
}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromProto(
    SentencePieceModelProto proto, const std::string& source) {
  auto tokenizer =
      std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(proto)));
  STRATA_RETURN_IF_ERROR(tokenizer->Init(source));
  return tokenizer;
}

absl::Status SentencePieceTokenizer::Init(const std::string& source) {
  const auto& pieces = proto_.pieces;
  if (pieces.empty()) return Invalid(source, "the model has no pieces");
  if (pieces.size() > static_cast<size_t>(INT32_MAX)) return Invalid(source, "too many pieces");
  normal_trie_ = std::make_unique<PieceTrie>();
  user_defined_trie_ = std::make_unique<PieceTrie>();
  byte_ids_.fill(-1);
  byte_values_.assign(pieces.size(), -1);
  // sentencepiece starts the maximum at FLT_MIN (the smallest *positive*
  // float) and maps an untouched bound to 0, so with the usual all-negative
  // scores max_score_ is 0 and a user-defined symbol scores -0.1. Mirrored
  // exactly because it decides unigram segmentations.
  min_score_ = std::numeric_limits<float>::max();
  max_score_ = std::numeric_limits<float>::min();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto& p = pieces[i];
    const auto id = static_cast<int32_t>(i);
    if (p.piece.empty()) return Invalid(source, absl::StrCat("piece ", i, " is empty"));
    const bool is_normal = p.type == PieceType::kNormal || p.type == PieceType::kUserDefined ||
                           p.type == PieceType::kUnused;
    auto& map = is_normal ? normal_pieces_ : reserved_pieces_;
    if (!map.emplace(p.piece, id).second) {
      return Invalid(source, absl::StrCat("piece \"", p.piece, "\" is defined twice"));
    }
    if (is_normal) normal_trie_->Insert(p.piece, id);
    if (p.type == PieceType::kUserDefined) user_defined_trie_->Insert(p.piece, id);
    if (p.type == PieceType::kUnknown) {
      if (unk_id_ >= 0) return Invalid(source, "more than one unknown piece");
      unk_id_ = id;
    }
    if (p.type == PieceType::kByte) {
      if (!proto_.byte_fallback) {
        return Invalid(source,
                       absl::StrCat("byte piece ", p.piece, " found but byte_fallback is off"));
      }
      const int byte = PieceToByte(p.piece);
      if (byte < 0) return Invalid(source, absl::StrCat("invalid byte piece ", p.piece));
      byte_ids_[byte] = id;
      byte_values_[i] = static_cast<int16_t>(byte);
    }
    if (p.type == PieceType::kNormal) {
      min_score_ = std::min(min_score_, p.score);
      max_score_ = std::max(max_score_, p.score);
    }
  }
  if (min_score_ == std::numeric_limits<float>::max()) min_score_ = 0.0f;
  if (max_score_ == std::numeric_limits<float>::min()) max_score_ = 0.0f;
  if (unk_id_ < 0) return Invalid(source, "the model has no unknown piece");
  if (proto_.byte_fallback &&
      std::find(byte_ids_.begin(), byte_ids_.end(), -1) != byte_ids_.end()) {
    return Invalid(source, "byte_fallback is on but not all 256 byte pieces exist");
  }
  if (!proto_.precompiled_charsmap.empty()) {
    absl::StatusOr<std::unique_ptr<CharsMap>> map =
        CharsMap::Create(proto_.precompiled_charsmap, source);
    if (!map.ok()) return map.status();
    charsmap_ = *std::move(map);
  }
  // Like SentencePieceProcessor::bos_id(): the id of the configured piece,
  // and only when it is a control symbol.
  auto control_id = [&](const std::string& piece) {
    const auto it = reserved_pieces_.find(piece);
    if (it == reserved_pieces_.end() || !IsType(it->second, PieceType::kControl)) return -1;
    return it->second;
  };
  bos_id_ = control_id(proto_.bos_piece);
  eos_id_ = control_id(proto_.eos_piece);
  pad_id_ = control_id(proto_.pad_piece);
  return absl::OkStatus();
}

void SentencePieceTokenizer::ApplyConfig(const TokenizerConfig& config) {
  Tokenizer::ApplyConfig(config);
  auto resolve = [&](const std::optional<std::string>& name, int32_t* id) {
    if (!name.has_value()) return;
    if (const int32_t found = PieceToId(*name); found >= 0) *id = found;
  };
  resolve(config.bos_token, &bos_id_);
  resolve(config.eos_token, &eos_id_);
  resolve(config.pad_token, &pad_id_);
}

bool SentencePieceTokenizer::IsType(int32_t id, PieceType type) const {
  return id >= 0 && static_cast<size_t>(id) < proto_.pieces.size() &&
         proto_.pieces[static_cast<size_t>(id)].type == type;
}

int32_t SentencePieceTokenizer::vocab_size() const {
  return static_cast<int32_t>(proto_.pieces.size());
}

int32_t SentencePieceTokenizer::PieceToId(const std::string& piece) const {
  if (const auto it = reserved_pieces_.find(piece); it != reserved_pieces_.end()) {
    return it->second;
  }
  return LookupNormal(piece);
}

std::string SentencePieceTokenizer::IdToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return proto_.pieces[static_cast<size_t>(id)].piece;
}

int32_t SentencePieceTokenizer::LookupNormal(std::string_view piece) const {
  const auto it = normal_pieces_.find(piece);
  return it == normal_pieces_.end() ? -1 : it->second;
}

int32_t SentencePieceTokenizer::LookupOrUnk(std::string_view piece) const {
  if (const auto it = reserved_pieces_.find(piece); it != reserved_pieces_.end()) {
    return it->second;
  }
  const int32_t id = LookupNormal(piece);
  return id >= 0 ? id : unk_id_;
}

size_t SentencePieceTokenizer::MatchUserDefined(std::string_view text) const {
  size_t longest = 0;
  user_defined_trie_->ForEachPrefix(text, [&](size_t length, int32_t) { longest = length; });
  return longest;
}

std::pair<std::string_view, size_t> SentencePieceTokenizer::NormalizePrefix(
    std::string_view input) const {
  if (input.empty()) return {std::string_view(), 0};
  // User-defined symbols pass through unnormalized so they stay matchable.
  if (const size_t n = MatchUserDefined(input); n > 0) return {input.substr(0, n), n};
  if (charsmap_ != nullptr) {
    const auto match = charsmap_->LongestMatch(input);
    if (match.second > 0) return match;
  }
  const Utf8Char c = DecodeUtf8Char(input);
  // A malformed byte becomes U+FFFD but consumes only itself.
  if (!c.valid) return {kReplacementUtf8, 1};
  return {input.substr(0, c.length), c.length};
}

std::string SentencePieceTokenizer::Normalize(std::string_view input) const {
  std::string out;
  const bool remove_extra = proto_.remove_extra_whitespaces;
  const bool escape = proto_.escape_whitespaces;
  if (remove_extra) {
    while (!input.empty()) {
      const auto [normalized, consumed] = NormalizePrefix(input);
      if (normalized != " ") break;
      input.remove_prefix(consumed);
    }
  }
  if (input.empty()) return out;
  out.reserve(input.size() * 3);
  const std::string_view space = escape ? kSpaceSymbol : std::string_view(" ");
  const bool suffix = proto_.treat_whitespace_as_suffix;
  if (!suffix && proto_.add_dummy_prefix) out.append(space);
  bool is_prev_space = remove_extra;
  while (!input.empty()) {
    auto [normalized, consumed] = NormalizePrefix(input);
    if (is_prev_space) {
      while (!normalized.empty() && normalized.front() == ' ') normalized.remove_prefix(1);
    }
    if (!normalized.empty()) {
      for (char ch : normalized) {
        if (escape && ch == ' ') {
          out.append(kSpaceSymbol);
        } else {
          out.push_back(ch);
        }
      }
      is_prev_space = normalized.back() == ' ';
    }
    input.remove_prefix(consumed);
    if (!remove_extra) is_prev_space = false;
  }
  if (remove_extra) {
    while (out.size() >= space.size() && out.ends_with(space))
      out.resize(out.size() - space.size());
  }
  if (suffix && proto_.add_dummy_prefix) out.append(space);
  return out;
}

std::vector<SentencePieceTokenizer::Result> SentencePieceTokenizer::EncodeBpe(
    std::string_view normalized) const {
  // sentencepiece's BPE: start from characters (user-defined symbols are
  // single frozen symbols) and repeatedly merge the adjacent pair whose
  // concatenation is the highest-scoring piece, leftmost on ties.
  struct Symbol {
    int prev;
    int next;
    bool freeze;
    size_t begin;
    size_t length;  // 0 once merged into its left neighbour
  };
  struct Candidate {
    int left;
    int right;
    float score;
    size_t length;
  };
  struct Lower {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };
  std::vector<Symbol> symbols;
  symbols.reserve(normalized.size());
  for (size_t pos = 0; pos < normalized.size();) {
    size_t length = MatchUserDefined(normalized.substr(pos));
    const bool freeze = length > 0;
    if (!freeze) {
      length = std::min(Utf8LengthFromLeadByte(static_cast<uint8_t>(normalized[pos])),
                        normalized.size() - pos);
    }
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, -1, freeze, pos, length});
    pos += length;
    if (pos < normalized.size()) symbols.back().next = index + 1;
  }
  if (symbols.empty()) return {};

  std::priority_queue<Candidate, std::vector<Candidate>, Lower> agenda;
  // Merged pieces that are UNUSED in the vocabulary are split back into the
  // two pieces they were made from (sentencepiece's resegmentation).
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge;
  auto piece_of = [&](const Symbol& s) { return normalized.substr(s.begin, s.length); };
  auto maybe_add = [&](int left, int right) {
    if (left < 0 || right < 0 || symbols[left].freeze || symbols[right].freeze) return;
    const std::string_view merged =
        normalized.substr(symbols[left].begin, symbols[left].length + symbols[right].length);
    const int32_t id = LookupNormal(merged);
    if (id < 0) return;
    agenda.push({left, right, proto_.pieces[static_cast<size_t>(id)].score, merged.size()});
    if (IsType(id, PieceType::kUnused)) {
      rev_merge[merged] = {piece_of(symbols[left]), piece_of(symbols[right])};
    }
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    maybe_add(static_cast<int>(i) - 1, static_cast<int>(i));
  }
  while (!agenda.empty()) {
    const Candidate top = agenda.top();
    agenda.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    // Stale: one side was merged away or grew since this pair was queued.
    if (left.length == 0 || right.length == 0 || left.length + right.length != top.length) {
      continue;
    }
    left.length += right.length;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.length = 0;
    maybe_add(left.prev, top.left);
    maybe_add(top.left, left.next);
  }

  std::vector<Result> results;
  std::function<void(std::string_view)> resegment = [&](std::string_view piece) {
    const int32_t id = LookupOrUnk(piece);
    if (IsType(id, PieceType::kUnused)) {
      if (const auto it = rev_merge.find(piece); it != rev_merge.end()) {
        resegment(it->second.first);
        resegment(it->second.second);
        return;
      }
    }
    results.push_back({piece, id});
  };
  for (int i = 0; i != -1; i = symbols[i].next) resegment(piece_of(symbols[i]));
  return results;
}

std::vector<SentencePieceTokenizer::Result> SentencePieceTokenizer::EncodeUnigram(
    std::string_view normalized) const {
  // Viterbi over the lattice of all pieces, computed on the fly as in
  // sentencepiece's optimized unigram encoder: best_ends_at[i] is the best
  // path covering normalized[0, i). Score arithmetic mirrors sentencepiece's
  // (float path scores, double user-defined bonus) so ties break the same way.
  struct BestPath {
    int32_t id = -1;
    float score = 0.0f;
    int64_t starts_at = -1;
  };
  const size_t size = normalized.size();
  const float unk_score = min_score_ - kUnkPenalty;
  std::vector<BestPath> best(size + 1);
  size_t starts_at = 0;
  while (starts_at < size) {
    const float score_till_here = best[starts_at].score;
    bool has_single_node = false;
    const size_t char_length = std::min(
        Utf8LengthFromLeadByte(static_cast<uint8_t>(normalized[starts_at])), size - starts_at);
    normal_trie_->ForEachPrefix(normalized.substr(starts_at), [&](size_t length, int32_t id) {
      const auto& piece = proto_.pieces[static_cast<size_t>(id)];
      if (piece.type == PieceType::kUnused) return;
      BestPath& target = best[starts_at + length];
      const double score = piece.type == PieceType::kUserDefined
                               ? static_cast<double>(static_cast<float>(length) * max_score_) - 0.1
                               : static_cast<double>(piece.score);
      const double candidate = score + static_cast<double>(score_till_here);
      if (target.starts_at == -1 || candidate > static_cast<double>(target.score)) {
        target.score = static_cast<float>(candidate);
        target.starts_at = static_cast<int64_t>(starts_at);
        target.id = id;
      }
      if (length == char_length) has_single_node = true;
    });
    if (!has_single_node) {
      BestPath& target = best[starts_at + char_length];
      const float candidate = unk_score + score_till_here;
      if (target.starts_at == -1 || candidate > target.score) {
        target.score = candidate;
        target.starts_at = static_cast<int64_t>(starts_at);
        target.id = unk_id_;
      }
    }
    starts_at += char_length;
  }
  std::vector<Result> results;
  for (size_t end = size; end > 0;) {
    const BestPath& node = best[end];
    const auto begin = static_cast<size_t>(node.starts_at);
    results.push_back({normalized.substr(begin, end - begin), node.id});
    end = begin;
  }
  std::reverse(results.begin(), results.end());
  return results;
}

std::vector<SentencePieceTokenizer::Result> SentencePieceTokenizer::EncodeWord(
    std::string_view normalized) const {
  // Words start at each U+2581 (or end after it with the suffix convention).
  std::vector<Result> results;
  const bool suffix = proto_.treat_whitespace_as_suffix;
  size_t word_begin = 0;
  for (size_t pos = 0; pos < normalized.size();) {
    const size_t length = std::min(Utf8LengthFromLeadByte(static_cast<uint8_t>(normalized[pos])),
                                   normalized.size() - pos);
    const bool is_space = normalized.substr(pos, length) == kSpaceSymbol;
    if (!suffix && is_space && pos > word_begin) {
      results.push_back({normalized.substr(word_begin, pos - word_begin), 0});
      word_begin = pos;
    }
    pos += length;
    if (suffix && is_space) {
      results.push_back({normalized.substr(word_begin, pos - word_begin), 0});
      word_begin = pos;
    }
  }
  if (word_begin < normalized.size()) results.push_back({normalized.substr(word_begin), 0});
  for (Result& r : results) r.id = LookupOrUnk(r.piece);
  return results;
}

std::vector<SentencePieceTokenizer::Result> SentencePieceTokenizer::EncodeChar(
    std::string_view normalized) const {
  std::vector<Result> results;
  for (size_t pos = 0; pos < normalized.size();) {
    size_t length = MatchUserDefined(normalized.substr(pos));
    if (length == 0) {
      length = std::min(Utf8LengthFromLeadByte(static_cast<uint8_t>(normalized[pos])),
                        normalized.size() - pos);
    }
    const std::string_view piece = normalized.substr(pos, length);
    results.push_back({piece, LookupOrUnk(piece)});
    pos += length;
  }
  return results;
}

std::vector<int32_t> SentencePieceTokenizer::Encode(const std::string& text) const {
  const std::string normalized = Normalize(text);
  if (normalized.empty()) return {};
  std::vector<Result> results;
  switch (proto_.model_type) {
    case ModelType::kUnigram:
      results = EncodeUnigram(normalized);
      break;
    case ModelType::kBpe:
      results = EncodeBpe(normalized);
      break;
    case ModelType::kWord:
      results = EncodeWord(normalized);
      break;
    case ModelType::kChar:
      results = EncodeChar(normalized);
      break;
  }
  // As SentencePieceProcessor::PopulateSentencePieceText: unknown pieces
  // become their UTF-8 bytes with byte fallback; otherwise a run of unknown
  // pieces collapses into a single <unk>.
  std::vector<int32_t> ids;
  ids.reserve(results.size());
  bool prev_unknown = false;
  for (const Result& r : results) {
    const bool unknown = IsType(r.id, PieceType::kUnknown);
    if (unknown && proto_.byte_fallback) {
      for (char b : r.piece) ids.push_back(byte_ids_[static_cast<uint8_t>(b)]);
    } else if (!(unknown && prev_unknown)) {
      ids.push_back(r.id);
    }
    prev_unknown = unknown;
  }
  return ids;
}

std::string SentencePieceTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  std::string pending_bytes;
  // A run of byte pieces becomes UTF-8; each byte that does not start a
  // valid character becomes U+FFFD on its own (sentencepiece's rule).
  auto flush_bytes = [&] {
    std::string_view bytes = pending_bytes;
    while (!bytes.empty()) {
      const Utf8Char c = DecodeUtf8Char(bytes);
      if (c.valid) {
        text.append(bytes.substr(0, c.length));
      } else {
        text.append(kReplacementUtf8);
      }
      bytes.remove_prefix(c.length);
    }
    pending_bytes.clear();
  };
  // Only the dummy prefix of the first word is dropped: while nothing has
  // been emitted, the first piece that starts with U+2581 loses it (with
  // remove_extra_whitespaces, every such piece until text appears, since the
  // encoder never produced leading whitespace).
  const bool strip_leading = proto_.add_dummy_prefix || proto_.remove_extra_whitespaces;
  bool is_bos_ws = true;
  bool bos_ws_seen = false;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    const auto& piece = proto_.pieces[static_cast<size_t>(id)];
    if (piece.type == PieceType::kByte) {
      pending_bytes.push_back(static_cast<char>(byte_values_[static_cast<size_t>(id)]));
      continue;
    }
    flush_bytes();
    if (bos_ws_seen || !text.empty()) is_bos_ws = false;
    bos_ws_seen = false;
    if (piece.type == PieceType::kControl) continue;
    if (piece.type == PieceType::kUnknown) {
      text.append(proto_.unk_surface);
      continue;
    }
    std::string_view surface = piece.piece;
    if (is_bos_ws && strip_leading && surface.starts_with(kSpaceSymbol)) {
      surface.remove_prefix(kSpaceSymbol.size());
      bos_ws_seen = !proto_.remove_extra_whitespaces;
    }
    while (!surface.empty()) {
      if (surface.starts_with(kSpaceSymbol)) {
        text.push_back(' ');
        surface.remove_prefix(kSpaceSymbol.size());
      } else {
        text.push_back(surface.front());
        surface.remove_prefix(1);
      }
    }
  }
  flush_bytes();
  return text;
}

}  // namespace strata::policies
