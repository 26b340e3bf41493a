// SentencePieceTokenizer against the reference tools: models are trained with
// spm_train on a generated corpus and every test sentence must encode to the
// ids spm_encode prints and decode to the text spm_decode prints.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "policies/tokenizer/sentencepiece_model.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using ::strata::testing::CommandResult;
using ::strata::testing::RunCommand;
using ::strata::testing::TempDir;
using ::strata::testing::WriteTextFile;

// A small deterministic generator so the corpus (and so the trained models)
// is the same on every run.
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  uint32_t Next(uint32_t bound) {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>((state_ >> 33) % bound);
  }

 private:
  uint64_t state_;
};

// A few hundred lines of English-ish text with punctuation, digits, accented
// Latin, CJK and emoji, so the vocabularies have merges worth testing.
std::string MakeCorpus() {
  const std::vector<std::string> words = {
      "the",      "of",       "and",      "to",       "in",        "is",          "that",   "for",    "it",
      "with",     "as",       "was",      "on",       "be",        "at",          "by",     "this",   "have",
      "from",     "or",       "one",      "had",      "not",       "but",         "what",   "all",    "were",
      "when",     "we",       "there",    "can",      "an",        "your",        "which",  "their",  "said",
      "each",     "she",      "do",       "how",      "if",        "will",        "up",     "other",  "about",
      "out",      "many",     "then",     "them",     "these",     "so",          "some",   "her",    "would",
      "make",     "like",     "him",      "into",     "time",      "has",         "look",   "two",    "more",
      "write",    "go",       "see",      "number",   "no",        "way",         "could",  "people", "my",
      "than",     "first",    "water",    "been",     "call",      "who",         "oil",    "its",    "now",
      "find",     "long",     "down",     "day",      "did",       "get",         "come",   "made",   "may",
      "part",     "The",      "Hello",    "World",    "Tokenizer", "training",    "policy", "reward", "model",
      "learning", "gradient", "token",    "tokens",   "sentence",  "piece",       "pieces", "café",   "naïve",
      "résumé",   "über",     "señor",    "façade",   "Ångström",  "smörgåsbord", "日本語", "東京",   "中文",
      "你好",     "世界",     "テキスト", "ひらがな", "😀",         "🚀",           "👍"};
  const std::vector<std::string> punct = {",", ".", "!", "?", ";", ":", " -", "\"", "'s", ")"};
  Lcg rng(42);
  std::string corpus;
  for (int line = 0; line < 400; ++line) {
    const uint32_t n = 4 + rng.Next(12);
    for (uint32_t i = 0; i < n; ++i) {
      if (i > 0) corpus += ' ';
      const uint32_t kind = rng.Next(20);
      if (kind == 0) {
        corpus += std::to_string(rng.Next(100000));
      } else if (kind == 1 && i > 0) {
        corpus += absl::StrCat("(", words[rng.Next(words.size())], ")");
      } else {
        corpus += words[rng.Next(words.size())];
      }
      if (rng.Next(6) == 0) corpus += punct[rng.Next(punct.size())];
    }
    corpus += '\n';
  }
  return corpus;
}

// Sentences every model must agree with the reference on: unseen characters,
// whitespace runs, NFKC-affected characters, emoji, invalid UTF-8, empty.
std::vector<std::string> TestSentences() {
  std::vector<std::string> sentences = {
      "Hello world.",
      "The quick brown fox jumps over the lazy dog!",
      "",
      "   leading spaces",
      "trailing spaces   ",
      "multiple    internal     spaces",
      " ",
      "    ",
      "\tTabbed\ttext\t",
      "Numbers 12345 and 3.14159, plus 2024-06-01.",
      "Café naïve résumé über señor façade Ångström smörgåsbord",
      "日本語のテキストと東京",
      "你好，世界！",
      "Emoji: 😀 🚀 👍 🦀 🧬",
      "Unseen scripts: Ωμέγα αβγ Привет мир 안녕하세요 שלום",
      "Full-width: ＡＢＣ １２３ ｈｅｌｌｏ！",
      "Ligatures ﬁ ﬂ, ① ② ③, ™ ½ and\u3000ideographic space",
      "Combining e\u0301 vs \u00e9, A\u030a vs \u00c5",
      "NBSP\u00a0here and zero\u200bwidth",
      "<s> and </s> and <unk> in text",
      "user symbols <sep> and [MASK] inline<sep>",
      "a",
      "ab",
      "x=1; y=(2+3)*4 / 5% #hash @at $5 ^caret ~tilde `back` |pipe| \\slash",
      "Ünïcödé ÇÀPS and ßtraße",
      "control \x01 char and bell \x07",
      "bad bytes \xff\xfe and truncated \xe6\x97 end",
      "surrogate \xed\xa0\x80 and overlong \xc0\xaf",
      "\xe2\x96\x81 literal meta symbol \xe2\x96\x81\xe2\x96\x81",
      "the the the the the the the the",
      // A user-defined symbol whose parts are frequent pieces: the unigram
      // bonus for user-defined symbols decides.
      "thethethe and thethethethe",
      // Overlapping candidate merges (ll|l vs l|ll): BPE must merge leftmost.
      "alllll wellll seee thhhe oooo eeee 0000 ....",
      "tokenizer training policy reward model learning gradient",
  };
  // A couple of KB of corpus-like text on one line.
  const std::string corpus = MakeCorpus();
  std::string long_line = corpus.substr(0, 3000);
  for (char& c : long_line) {
    if (c == '\n') c = ' ';
  }
  sentences.push_back(long_line);
  return sentences;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

class SentencePieceTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::HaveProgram("spm_train") || !testing::HaveProgram("spm_encode") ||
        !testing::HaveProgram("spm_decode")) {
      return;
    }
    dir_ = new TempDir();
    WriteTextFile(dir_->Join("corpus.txt"), MakeCorpus());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (dir_ == nullptr) GTEST_SKIP() << "spm_train / spm_encode / spm_decode not installed";
  }

  // Trains `name`.model with the common flags plus `flags`; returns its path.
  static std::string Train(const std::string& name, const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {"spm_train",
                                     absl::StrCat("--input=", dir_->Join("corpus.txt")),
                                     absl::StrCat("--model_prefix=", dir_->Join(name)),
                                     "--minloglevel=2",
                                     "--num_threads=1",
                                     "--hard_vocab_limit=false",
                                     "--random_seed=1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<CommandResult> result = RunCommand(argv);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return "";
    EXPECT_EQ(result->exit_code, 0) << "spm_train failed for " << name;
    return dir_->Join(name + ".model");
  }

  // spm_encode --output_format=id, one id list per sentence.
  static std::vector<std::vector<int32_t>> ReferenceEncode(const std::string& model,
                                                           const std::vector<std::string>& lines) {
    const std::string input = dir_->Join("encode_input.txt");
    WriteTextFile(input, absl::StrCat(absl::StrJoin(lines, "\n"), "\n"));
    absl::StatusOr<CommandResult> result = RunCommand({"spm_encode", absl::StrCat("--model=", model),
                                                       "--output_format=id", "--minloglevel=2",
                                                       absl::StrCat("--input=", input)});
    EXPECT_TRUE(result.ok()) << result.status();
    std::vector<std::vector<int32_t>> ids;
    if (!result.ok()) return ids;
    EXPECT_EQ(result->exit_code, 0);
    for (const std::string& line : SplitLines(result->output)) {
      std::vector<int32_t> row;
      for (const absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        row.push_back(std::stoi(std::string(field)));
      }
      ids.push_back(std::move(row));
    }
    return ids;
  }

  // spm_decode --input_format=id, one text per id list.
  static std::vector<std::string> ReferenceDecode(const std::string& model,
                                                  const std::vector<std::vector<int32_t>>& ids) {
    const std::string input = dir_->Join("decode_input.txt");
    std::string text;
    for (const auto& row : ids) absl::StrAppend(&text, absl::StrJoin(row, " "), "\n");
    WriteTextFile(input, text);
    absl::StatusOr<CommandResult> result = RunCommand({"spm_decode", absl::StrCat("--model=", model),
                                                       "--input_format=id", "--minloglevel=2",
                                                       absl::StrCat("--input=", input)});
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return {};
    EXPECT_EQ(result->exit_code, 0);
    return SplitLines(result->output);
  }

  // Encodes `lines` with both implementations and compares, then decodes the
  // reference ids plus `extra_ids` with both and compares.
  static void ExpectMatchesReference(const std::string& model_path, const std::vector<std::string>& lines,
                                     const std::vector<std::vector<int32_t>>& extra_ids = {}) {
    absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> tokenizer = SentencePieceTokenizer::FromFile(model_path);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const std::vector<std::vector<int32_t>> expected = ReferenceEncode(model_path, lines);
    ASSERT_EQ(expected.size(), lines.size());
    int mismatches = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::vector<int32_t> ids = (*tokenizer)->Encode(lines[i]);
      EXPECT_EQ(ids, expected[i]) << "sentence " << i << ": \"" << lines[i] << "\"\n  normalized: \""
                                  << (*tokenizer)->Normalize(lines[i]) << "\"";
      if (ids != expected[i] && ++mismatches > 5) break;
    }
    std::vector<std::vector<int32_t>> decode_inputs = expected;
    decode_inputs.insert(decode_inputs.end(), extra_ids.begin(), extra_ids.end());
    const std::vector<std::string> texts = ReferenceDecode(model_path, decode_inputs);
    ASSERT_EQ(texts.size(), decode_inputs.size());
    for (size_t i = 0; i < decode_inputs.size(); ++i) {
      EXPECT_EQ((*tokenizer)->Decode(decode_inputs[i]), texts[i]) << "ids: " << absl::StrJoin(decode_inputs[i], " ");
    }
  }

  // Id sequences that exercise the decoder beyond what encoding produces:
  // control tokens, lone / broken byte pieces, unk, pieces that start with ▁.
  static std::vector<std::vector<int32_t>> DecoderEdgeCases(const SentencePieceTokenizer& t) {
    std::vector<std::vector<int32_t>> cases;
    const int32_t bos = t.bos_id();
    const int32_t eos = t.eos_id();
    const int32_t unk = t.unk_id();
    const int32_t space = t.PieceToId("\xE2\x96\x81");
    const int32_t the = t.PieceToId("\xE2\x96\x81the");
    const int32_t e4 = t.PieceToId("<0xE4>");
    const int32_t b8 = t.PieceToId("<0xB8>");
    const int32_t ad = t.PieceToId("<0xAD>");
    const int32_t ff = t.PieceToId("<0xFF>");
    cases.push_back({bos, the, the, eos});
    cases.push_back({unk, the, unk, unk});
    if (space >= 0 && the >= 0) {
      cases.push_back({space, space, the});
      cases.push_back({bos, space, the, space});
    }
    if (e4 >= 0) {
      cases.push_back({e4, b8, ad, the});         // 中 then a word
      cases.push_back({the, e4, b8});             // truncated character
      cases.push_back({e4, the, ad});             // interrupted character
      cases.push_back({ff, e4, b8, ad, ff, ff});  // invalid bytes around a valid one
      cases.push_back({bos, e4, b8, ad});
    }
    // Pieces this vocabulary lacks (-1) are dropped from the cases.
    for (auto& c : cases) c.erase(std::remove(c.begin(), c.end(), -1), c.end());
    return cases;
  }

  static TempDir* dir_;
};

TempDir* SentencePieceTokenizerTest::dir_ = nullptr;

std::vector<std::string> CorpusLines() { return SplitLines(MakeCorpus()); }

TEST_F(SentencePieceTokenizerTest, BpeByteFallbackIdentityMatchesReference) {
  // Llama-2's recipe: BPE, byte fallback, identity normalization, dummy
  // prefix, whitespace kept as is, digits split.
  const std::string model = Train("llama2_like", {"--model_type=bpe", "--vocab_size=600", "--byte_fallback=true",
                                                  "--normalization_rule_name=identity", "--add_dummy_prefix=true",
                                                  "--remove_extra_whitespaces=false", "--split_digits=true",
                                                  "--allow_whitespace_only_pieces=true", "--character_coverage=0.999"});
  ASSERT_FALSE(model.empty());
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> t = SentencePieceTokenizer::FromFile(model);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->proto().byte_fallback);
  EXPECT_EQ((*t)->proto().model_type, SentencePieceModelProto::ModelType::kBpe);
  EXPECT_EQ((*t)->bos_id(), 1);
  EXPECT_EQ((*t)->eos_id(), 2);
  EXPECT_EQ((*t)->pad_id(), -1);
  // Characters the model never saw must come out as byte pieces.
  const std::vector<int32_t> crab = (*t)->Encode("🦀");
  ASSERT_GE(crab.size(), 4u);
  EXPECT_EQ((*t)->IdToPiece(crab[crab.size() - 4]), "<0xF0>");
  ExpectMatchesReference(model, TestSentences(), DecoderEdgeCases(**t));
  ExpectMatchesReference(model, CorpusLines());
}

TEST_F(SentencePieceTokenizerTest, UnigramNfkcMatchesReference) {
  const std::string model = Train("unigram_nfkc", {"--model_type=unigram", "--vocab_size=500",
                                                   "--user_defined_symbols=<sep>,[MASK],thethethe"});
  ASSERT_FALSE(model.empty());
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> t = SentencePieceTokenizer::FromFile(model);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->proto().normalizer_name, "nmt_nfkc");
  EXPECT_FALSE((*t)->proto().precompiled_charsmap.empty());
  // NFKC folds full-width letters, so these normalize identically.
  EXPECT_EQ((*t)->Normalize("ＡＢＣ１２３"), (*t)->Normalize("ABC123"));
  EXPECT_EQ((*t)->Encode("ＡＢＣ１２３"), (*t)->Encode("ABC123"));
  ExpectMatchesReference(model, TestSentences(), DecoderEdgeCases(**t));
  ExpectMatchesReference(model, CorpusLines());
}

TEST_F(SentencePieceTokenizerTest, BpeWithoutByteFallbackMatchesReference) {
  // Unknown characters become <unk> (runs of them a single <unk>), and
  // user-defined symbols are matched as whole pieces.
  const std::string model = Train("bpe_unk", {"--model_type=bpe", "--vocab_size=400",
                                              "--user_defined_symbols=<sep>,[MASK]", "--control_symbols=<ctrl>"});
  ASSERT_FALSE(model.empty());
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> t = SentencePieceTokenizer::FromFile(model);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE((*t)->proto().byte_fallback);
  const int32_t sep = (*t)->PieceToId("<sep>");
  ASSERT_GE(sep, 0);
  const std::vector<int32_t> ids = (*t)->Encode("a<sep>b");
  EXPECT_NE(std::find(ids.begin(), ids.end(), sep), ids.end());
  // Two unseen characters in a row are one <unk>.
  const std::vector<int32_t> unseen = (*t)->Encode("ΩΩ");
  EXPECT_EQ(std::count(unseen.begin(), unseen.end(), (*t)->unk_id()), 1);
  std::vector<std::vector<int32_t>> extra = DecoderEdgeCases(**t);
  extra.push_back({(*t)->PieceToId("<ctrl>"), sep, (*t)->PieceToId("[MASK]")});
  ExpectMatchesReference(model, TestSentences(), extra);
  ExpectMatchesReference(model, CorpusLines());
}

TEST_F(SentencePieceTokenizerTest, UnigramWithoutDummyPrefixMatchesReference) {
  // No dummy prefix and whitespace kept: decoding must not invent or drop
  // leading spaces differently from spm_decode.
  const std::string model = Train("unigram_raw", {"--model_type=unigram", "--vocab_size=400", "--byte_fallback=true",
                                                  "--normalization_rule_name=identity", "--add_dummy_prefix=false",
                                                  "--remove_extra_whitespaces=false"});
  ASSERT_FALSE(model.empty());
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> t = SentencePieceTokenizer::FromFile(model);
  ASSERT_TRUE(t.ok()) << t.status();
  ExpectMatchesReference(model, TestSentences(), DecoderEdgeCases(**t));
}

TEST_F(SentencePieceTokenizerTest, CharAndWordModelsMatchReference) {
  for (const char* type : {"char", "word"}) {
    SCOPED_TRACE(type);
    const std::string model = Train(absl::StrCat("model_", type),
                                    {absl::StrCat("--model_type=", type), "--vocab_size=300", "--use_all_vocab=false"});
    ASSERT_FALSE(model.empty());
    ExpectMatchesReference(model, TestSentences());
  }
}

TEST_F(SentencePieceTokenizerTest, EncodesKilobytesInMilliseconds) {
  const std::string model = Train("perf", {"--model_type=bpe", "--vocab_size=600", "--byte_fallback=true",
                                           "--normalization_rule_name=identity", "--remove_extra_whitespaces=false"});
  ASSERT_FALSE(model.empty());
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> t = SentencePieceTokenizer::FromFile(model);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string text = MakeCorpus().substr(0, 8192);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = (*t)->Encode(text);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(ids.empty());
  // Typically ~1 ms; the bound only catches quadratic behaviour on a loaded
  // 2-core build machine.
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(), 250);
  // Identity normalization and byte fallback make the round trip exact.
  EXPECT_EQ((*t)->Decode(ids), text);
}

}  // namespace
}  // namespace strata::policies
