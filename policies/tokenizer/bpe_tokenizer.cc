// HfBpeTokenizer: the top level of tokenizer.json (components, added tokens,
// special tokens) and the encode / decode passes. The parts live beside it:
// field accessors in hf_json.h, the BPE model in hf_bpe_model.h, normalizers,
// pre-tokenizers and decoders in hf_components.h.
#include "policies/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/tokenizer/hf_bpe_model.h"
#include "policies/tokenizer/hf_components.h"
#include "policies/tokenizer/hf_json.h"
#include "policies/tokenizer/hf_text.h"
#include "policies/tokenizer/unicode.h"

namespace strata::policies {
namespace {

using internal::BpeModel;
using internal::CheckedId;
using internal::DecoderStep;
using internal::ExpandSequence;
using internal::Fail;
using internal::Find;
using internal::Json;
using internal::LastChar;
using internal::NormalizerStep;
using internal::OptionalBool;
using internal::PreTokenizerStep;
using internal::Require;
using internal::RequireString;
using internal::SchemaError;
using internal::TypeOf;
using internal::Unsupported;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

bool IsWordChar(char32_t cp) { return cp == '_' || IsUnicodeLetter(cp) || IsUnicodeNumber(cp); }

// BOS / EOS as the post_processor would add them to a single sequence.
struct TemplateTokens {
  std::optional<std::string> bos;  // token names, resolved later
  std::optional<std::string> eos;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
};

void ParsePostProcessor(const Json& p, const std::string& where, TemplateTokens* out) {
  const std::string type = TypeOf(p, where);
  if (ExpandSequence(p, type, "processors", where, &ParsePostProcessor, out)) return;
  if (type == "ByteLevel") {
    // Only adjusts offsets.
  } else if (type == "TemplateProcessing") {
    const Json& single = Require(p, "single", where);
    // Items: (is_special, name). Serialized templates are arrays of
    // {"SpecialToken": {"id": ...}} / {"Sequence": {"id": "A"}}; the string
    // form "<s> $A" is accepted too.
    std::vector<std::pair<bool, std::string>> items;
    if (single.is_string()) {
      std::string_view rest = single.get_ref<const std::string&>();
      while (!rest.empty()) {
        const size_t space = rest.find(' ');
        std::string item(rest.substr(0, space));
        rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
        if (item.empty()) continue;
        if (const size_t colon = item.rfind(':'); colon != std::string::npos && colon > 0) {
          item.resize(colon);
        }
        items.emplace_back(!item.starts_with("$"), item);
      }
    } else if (single.is_array()) {
      for (const Json& item : single) {
        if (const Json* special = Find(item, "SpecialToken"); special != nullptr) {
          items.emplace_back(true, RequireString(*special, "id", where + ".single"));
        } else if (Find(item, "Sequence") != nullptr) {
          items.emplace_back(false, "");
        } else {
          Fail(absl::StrCat(where, ".single has an unknown item ", item.dump()));
        }
      }
    } else {
      Fail(absl::StrCat(where, ".single must be an array or a string"));
    }
    const Json* special_tokens = Find(p, "special_tokens");
    auto resolve = [&](const std::string& name) -> std::optional<int32_t> {
      if (special_tokens == nullptr) return std::nullopt;
      const Json* entry = Find(*special_tokens, name.c_str());
      if (entry == nullptr) return std::nullopt;
      const Json* ids = Find(*entry, "ids");
      if (ids == nullptr || !ids->is_array() || ids->empty() || !(*ids)[0].is_number_integer()) {
        return std::nullopt;
      }
      return (*ids)[0].get<int32_t>();
    };
    if (!items.empty() && items.front().first) {
      out->bos = items.front().second;
      out->bos_id = resolve(items.front().second);
    }
    if (items.size() > 1 && items.back().first) {
      out->eos = items.back().second;
      out->eos_id = resolve(items.back().second);
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const auto& [key, slot, slot_id] :
         {std::tuple{"cls", &out->bos, &out->bos_id}, std::tuple{"sep", &out->eos, &out->eos_id}}) {
      const Json& pair = Require(p, key, where);
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_number_integer()) {
        Fail(absl::StrCat(where, ".", key, " must be [token, id]"));
      }
      *slot = pair[0].get<std::string>();
      *slot_id = pair[1].get<int32_t>();
    }
  } else {
    Unsupported("post_processor", type);
  }
}

}  // namespace

// ---------------------------------------------------------------------------

struct HfBpeTokenizer::Impl {
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  bool has_decoder = false;
  std::vector<DecoderStep> decoders;
  BpeModel model;

  // Added tokens and the id -> string table.
  std::vector<AddedToken> added;
  std::array<std::vector<size_t>, 256> added_by_first_byte;  // longest first
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  std::vector<std::string> id_to_token;

  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t pad_id = -1;

  int32_t Lookup(const std::string& piece) const {
    if (const auto it = added_by_content.find(piece); it != added_by_content.end()) {
      return it->second;
    }
    const auto it = model.vocab.find(piece);
    return it == model.vocab.end() ? -1 : it->second;
  }

  // Normalizes, pre-tokenizes and BPE-encodes text between added tokens.
  void EncodeText(std::string_view text, bool at_start, std::vector<int32_t>* ids) const;
};

void HfBpeTokenizer::Impl::EncodeText(std::string_view text, bool at_start, std::vector<int32_t>* ids) const {
  std::string normalized(text);
  for (const NormalizerStep& step : normalizers) internal::ApplyNormalizer(step, &normalized);
  if (normalized.empty()) return;
  std::vector<internal::Piece> pieces;
  pieces.push_back({std::move(normalized), at_start});
  for (const PreTokenizerStep& step : pre_tokenizers) internal::ApplyPreTokenizer(step, &pieces);
  for (const internal::Piece& piece : pieces) {
    if (!piece.text.empty()) model.EncodeWord(piece.text, ids);
  }
}

// ---------------------------------------------------------------------------

HfBpeTokenizer::HfBpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HfBpeTokenizer::~HfBpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> HfBpeTokenizer::FromFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
  return FromJson(text, path);
}

absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> HfBpeTokenizer::FromJson(const std::string& json_text,
                                                                         const std::string& source) {
  const Json root = Json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON"));
  auto impl = std::make_unique<Impl>();
  TemplateTokens template_tokens;
  try {
    if (!root.is_object()) Fail("expected a JSON object");
    internal::ParseBpeModel(Require(root, "model", "tokenizer.json"), &impl->model);
    if (const Json* n = Find(root, "normalizer"); n != nullptr) {
      internal::ParseNormalizer(*n, "normalizer", &impl->normalizers);
    }
    if (const Json* p = Find(root, "pre_tokenizer"); p != nullptr) {
      internal::ParsePreTokenizer(*p, "pre_tokenizer", &impl->pre_tokenizers);
    }
    if (const Json* d = Find(root, "decoder"); d != nullptr) {
      impl->has_decoder = true;
      internal::ParseDecoder(*d, "decoder", &impl->decoders);
    }
    if (const Json* p = Find(root, "post_processor"); p != nullptr) {
      ParsePostProcessor(*p, "post_processor", &template_tokens);
    }
    if (const Json* added = Find(root, "added_tokens"); added != nullptr) {
      if (!added->is_array()) Fail("added_tokens must be an array");
      for (size_t i = 0; i < added->size(); ++i) {
        const Json& t = (*added)[i];
        const std::string where = absl::StrCat("added_tokens[", i, "]");
        AddedToken token;
        token.id = CheckedId(Require(t, "id", where), where + ".id");
        token.content = RequireString(t, "content", where);
        if (token.content.empty()) Fail(where + ".content is empty");
        token.special = OptionalBool(t, "special", false, where);
        token.lstrip = OptionalBool(t, "lstrip", false, where);
        token.rstrip = OptionalBool(t, "rstrip", false, where);
        token.single_word = OptionalBool(t, "single_word", false, where);
        impl->added.push_back(std::move(token));
      }
    }
  } catch (const SchemaError& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.message));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }

  // The id -> string table covers the vocab and the added tokens.
  int32_t max_id = -1;
  for (const auto& [token, id] : impl->model.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : impl->added) max_id = std::max(max_id, t.id);
  // Ids index a table; a stray huge id must not allocate gigabytes.
  const size_t entries = impl->model.vocab.size() + impl->added.size();
  if (static_cast<size_t>(max_id) >= 2 * entries + 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": token id ", max_id, " is far beyond the ", entries, " vocabulary entries"));
  }
  impl->id_to_token.resize(static_cast<size_t>(max_id) + 1);
  for (const auto& [token, id] : impl->model.vocab) impl->id_to_token[static_cast<size_t>(id)] = token;
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    impl->id_to_token[static_cast<size_t>(t.id)] = t.content;
    impl->added_by_id[t.id] = i;
    impl->added_by_content[t.content] = t.id;
    impl->added_by_first_byte[static_cast<uint8_t>(t.content[0])].push_back(i);
  }
  for (auto& bucket : impl->added_by_first_byte) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](size_t a, size_t b) { return impl->added[a].content.size() > impl->added[b].content.size(); });
  }

  auto resolve = [&](const std::optional<std::string>& name, const std::optional<int32_t>& id) {
    if (id.has_value() && *id >= 0 && static_cast<size_t>(*id) < impl->id_to_token.size()) {
      return *id;
    }
    return name.has_value() ? impl->Lookup(*name) : -1;
  };
  impl->bos_id = resolve(template_tokens.bos, template_tokens.bos_id);
  impl->eos_id = resolve(template_tokens.eos, template_tokens.eos_id);
  const bool template_adds_bos = impl->bos_id >= 0;
  const bool template_adds_eos = impl->eos_id >= 0;
  // No template (e.g. Llama-3 base without a post_processor): fall back to
  // the names these vocabularies conventionally use.
  auto first_present = [&](std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (const int32_t id = impl->Lookup(name); id >= 0) return id;
    }
    return -1;
  };
  if (impl->bos_id < 0) {
    impl->bos_id = first_present({"<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "<|endoftext|>"});
  }
  if (impl->eos_id < 0) {
    impl->eos_id = first_present({"</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>"});
  }
  impl->pad_id = first_present({"<pad>", "<|pad|>", "[PAD]"});

  auto tokenizer = std::unique_ptr<HfBpeTokenizer>(new HfBpeTokenizer(std::move(impl)));
  tokenizer->set_add_bos(template_adds_bos);
  tokenizer->set_add_eos(template_adds_eos);
  return tokenizer;
}

void HfBpeTokenizer::ApplyConfig(const TokenizerConfig& config) {
  Tokenizer::ApplyConfig(config);
  auto resolve = [&](const std::optional<std::string>& name, int32_t* id) {
    if (!name.has_value()) return;
    if (const int32_t found = impl_->Lookup(*name); found >= 0) *id = found;
  };
  resolve(config.bos_token, &impl_->bos_id);
  resolve(config.eos_token, &impl_->eos_id);
  resolve(config.pad_token, &impl_->pad_id);
}

std::vector<int32_t> HfBpeTokenizer::Encode(const std::string& text) const {
  std::vector<int32_t> ids;
  const std::string_view t = text;
  const Impl& impl = *impl_;
  // Added tokens first: leftmost-longest literal matches, the text between
  // them goes through the model (Hugging Face's AddedVocabulary split).
  size_t start_offset = 0;
  size_t search = 0;
  while (search < t.size()) {
    size_t match_begin = t.size();
    const AddedToken* match = nullptr;
    for (size_t i = search; i < t.size() && match == nullptr; ++i) {
      for (const size_t k : impl.added_by_first_byte[static_cast<uint8_t>(t[i])]) {
        if (t.substr(i).starts_with(impl.added[k].content)) {
          match = &impl.added[k];
          match_begin = i;
          break;
        }
      }
    }
    if (match == nullptr) break;
    size_t begin = match_begin;
    size_t end = match_begin + match->content.size();
    search = end;
    if (match->single_word) {
      const Utf8Char before = LastChar(t.substr(0, begin));
      const Utf8Char after = end < t.size() ? DecodeUtf8Char(t.substr(end)) : Utf8Char{};
      if ((before.valid && IsWordChar(before.code_point)) || (after.valid && IsWordChar(after.code_point))) {
        continue;
      }
    }
    if (match->lstrip) {
      size_t strip = begin;
      while (strip > start_offset) {
        const Utf8Char c = LastChar(t.substr(0, strip));
        if (!c.valid || !IsUnicodeWhitespace(c.code_point)) break;
        strip -= c.length;
      }
      begin = strip;
    }
    if (match->rstrip) {
      while (end < t.size()) {
        const Utf8Char c = DecodeUtf8Char(t.substr(end));
        if (!c.valid || !IsUnicodeWhitespace(c.code_point)) break;
        end += c.length;
      }
      search = end;
    }
    if (start_offset < begin) {
      impl.EncodeText(t.substr(start_offset, begin - start_offset), start_offset == 0, &ids);
    }
    ids.push_back(match->id);
    start_offset = end;
  }
  if (start_offset < t.size()) impl.EncodeText(t.substr(start_offset), start_offset == 0, &ids);
  return ids;
}

std::string HfBpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl.id_to_token.size()) continue;
    if (const auto it = impl.added_by_id.find(id); it != impl.added_by_id.end()) {
      if (impl.added[it->second].special) continue;
    }
    const std::string& token = impl.id_to_token[static_cast<size_t>(id)];
    if (!token.empty()) tokens.push_back(token);
  }
  std::string text;
  if (!impl.has_decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
    return text;
  }
  for (const DecoderStep& step : impl.decoders) internal::ApplyDecoder(step, &tokens);
  for (const std::string& t : tokens) text += t;
  return text;
}

int32_t HfBpeTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }
int32_t HfBpeTokenizer::bos_id() const { return impl_->bos_id; }
int32_t HfBpeTokenizer::eos_id() const { return impl_->eos_id; }
int32_t HfBpeTokenizer::pad_id() const { return impl_->pad_id; }

int32_t HfBpeTokenizer::PieceToId(const std::string& piece) const { return impl_->Lookup(piece); }

std::string HfBpeTokenizer::IdToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return impl_->id_to_token[static_cast<size_t>(id)];
}

}  // namespace strata::policies
