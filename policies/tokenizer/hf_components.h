// The tokenizer.json components around the model, parsed into steps and
// applied one step at a time: normalizers (hf_normalizers.cc), pre-tokenizers
// (hf_pre_tokenizers.cc) and decoders (hf_decoders.cc). Private to
// policies/tokenizer; bpe_tokenizer.h lists the supported types.
//
// The Parse* functions append the steps of one component (a Sequence expands
// into its members) and throw SchemaError (hf_json.h) naming `where` for an
// unsupported or malformed one.
#ifndef STRATA_POLICIES_TOKENIZER_HF_COMPONENTS_H_
#define STRATA_POLICIES_TOKENIZER_HF_COMPONENTS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "policies/tokenizer/hf_json.h"
#include "policies/tokenizer/unicode.h"

namespace strata::policies::internal {

struct NormalizerStep {
  enum class Kind { kPrepend, kReplace, kStrip, kUnicode };
  Kind kind = Kind::kReplace;
  UnicodeForm form = UnicodeForm::kNfc;  // kUnicode
  std::string from;                      // kReplace
  std::string to;                        // kReplace; kPrepend: the prefix
  bool left = false;                     // kStrip
  bool right = false;                    // kStrip
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStep {
  enum class Kind { kByteLevel, kSplitRegex, kSplitString, kMetaspace, kDigits };
  Kind kind = Kind::kByteLevel;
  bool add_prefix_space = false;                       // kByteLevel
  bool use_regex = true;                               // kByteLevel
  PretokenizerRegex regex = PretokenizerRegex::kGpt2;  // kSplitRegex
  std::string pattern;                                 // kSplitString
  SplitBehavior behavior = SplitBehavior::kIsolated;   // kSplit*
  bool invert = false;                                 // kSplit*
  std::string replacement;                             // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;      // kMetaspace
  bool split = true;                                   // kMetaspace
  bool individual_digits = false;                      // kDigits
};

struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string from;               // kReplace; kMetaspace: the replacement character
  std::string to;                 // kReplace
  char32_t strip_char = ' ';      // kStrip
  size_t strip_start = 0;         // kStrip
  size_t strip_stop = 0;          // kStrip
  bool strip_first_space = true;  // kMetaspace (prepend_scheme != never)
};

// A pre-tokenized piece; `at_start` when it begins at offset 0 of the input
// (Metaspace's prepend_scheme "first" only prefixes that one).
struct Piece {
  std::string text;
  bool at_start = false;
};

void ParseNormalizer(const Json& n, const std::string& where, std::vector<NormalizerStep>* out);
void ParsePreTokenizer(const Json& p, const std::string& where, std::vector<PreTokenizerStep>* out);
void ParseDecoder(const Json& d, const std::string& where, std::vector<DecoderStep>* out);

// Metaspace's options, read alike by its pre-tokenizer and its decoder:
// "prepend_scheme" in newer files, the boolean "add_prefix_space" in older
// ones; the replacement character (default U+2581).
PrependScheme ParsePrependScheme(const Json& step, const std::string& where);
std::string ParseReplacement(const Json& step, const std::string& where);

void ApplyNormalizer(const NormalizerStep& step, std::string* text);
// Splits (and maps) every piece; empty pieces are dropped.
void ApplyPreTokenizer(const PreTokenizerStep& step, std::vector<Piece>* pieces);
// Rewrites the token strings; Fuse, ByteLevel and ByteFallback may change
// their number.
void ApplyDecoder(const DecoderStep& step, std::vector<std::string>* tokens);

}  // namespace strata::policies::internal

#endif  // STRATA_POLICIES_TOKENIZER_HF_COMPONENTS_H_
