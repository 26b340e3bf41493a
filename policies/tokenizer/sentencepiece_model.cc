// SentencePieceTokenizer: vocabulary checks, normalization, and the encode /
// decode rules around the segmenters. Beside it: the ModelProto reader
// (sentencepiece_proto.cc), the segmenters (sentencepiece_segmenters.cc) and
// the tries (sentencepiece_tries.h).
#include "policies/tokenizer/sentencepiece_model.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/tokenizer/piece_syntax.h"
#include "policies/tokenizer/sentencepiece_tries.h"
#include "policies/tokenizer/unicode.h"

namespace strata::policies {
namespace {

using internal::kSpaceSymbol;
using PieceType = SentencePieceModelProto::PieceType;
using ModelType = SentencePieceModelProto::ModelType;

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceModelProto proto) : proto_(std::move(proto)) {
  set_add_bos(true);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto bytes, ReadFileToString(path));
  STRATA_ASSIGN_OR_RETURN(auto proto, ParseSentencePieceModelProto(bytes, path));
  return FromProto(std::move(proto), path);
}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromProto(SentencePieceModelProto proto,
                                                                                          const std::string& source) {
  auto tokenizer = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(proto)));
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
        return Invalid(source, absl::StrCat("byte piece ", p.piece, " found but byte_fallback is off"));
      }
      const int byte = internal::BytePieceValue(p.piece);
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
  if (proto_.byte_fallback && std::find(byte_ids_.begin(), byte_ids_.end(), -1) != byte_ids_.end()) {
    return Invalid(source, "byte_fallback is on but not all 256 byte pieces exist");
  }
  if (!proto_.precompiled_charsmap.empty()) {
    absl::StatusOr<std::unique_ptr<CharsMap>> map = CharsMap::Create(proto_.precompiled_charsmap, source);
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

int32_t SentencePieceTokenizer::vocab_size() const { return static_cast<int32_t>(proto_.pieces.size()); }

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

std::pair<std::string_view, size_t> SentencePieceTokenizer::NormalizePrefix(std::string_view input) const {
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
    while (out.size() >= space.size() && out.ends_with(space)) out.resize(out.size() - space.size());
  }
  if (suffix && proto_.add_dummy_prefix) out.append(space);
  return out;
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
