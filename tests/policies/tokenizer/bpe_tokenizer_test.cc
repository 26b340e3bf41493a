// HfBpeTokenizer on small hand-built tokenizer.json files whose expected ids
// are worked out by hand in the comments.
#include "policies/tokenizer/bpe_tokenizer.h"

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/tokenizer/unicode.h"

namespace strata::policies {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kMeta = "\xE2\x96\x81";  // ▁

std::string M(const std::string& rest) { return absl::StrCat(kMeta, rest); }

std::unique_ptr<HfBpeTokenizer> FromJsonOrDie(const Json& json) {
  absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> t = HfBpeTokenizer::FromJson(json.dump(), "test/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// ---------------------------------------------------------------------------
// Llama-2 style: SentencePiece-converted BPE with byte fallback.
//   ids 0..2: <unk> <s> </s>; 3..258: <0x00>..<0xFF>; then the pieces below.

constexpr int32_t kByteBase = 3;

Json Llama2Json(bool byte_fallback = true, bool fuse_unk = true) {
  Json vocab = Json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    vocab[absl::StrCat("<0x", std::string(1, kHex[b >> 4]), std::string(1, kHex[b & 15]), ">")] = kByteBase + b;
  }
  const std::vector<std::string> pieces = {M(""),      "h", "e", "l", "o",    M("h"), "ll",     M("he"), "llo",
                                           M("hello"), "w", "r", "d", M("w"), "or",   M("wor"), "ld",    M("world")};
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = 259 + static_cast<int>(i);
  // ▁=259 h=260 e=261 l=262 o=263 ▁h=264 ll=265 ▁he=266 llo=267 ▁hello=268
  // w=269 r=270 d=271 ▁w=272 or=273 ▁wor=274 ld=275 ▁world=276
  Json merges = Json::array(
      {M(" h"), "l l", M("h e"), "ll o", M("he llo"), M(" w"), "o r", M("w or"), "l d", M("wor ld")});
  Json added = Json::array();
  for (const auto& [id, content] : std::vector<std::pair<int, std::string>>{{0, "<unk>"}, {1, "<s>"}, {2, "</s>"}}) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", Json::array({{{"type", "Prepend"}, {"prepend", kMeta}},
                                     {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", Json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", Json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", Json::array({1})}, {"tokens", Json::array({"<s>"})}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", Json::array({{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", fuse_unk},
        {"byte_fallback", byte_fallback},
        {"vocab", vocab},
        {"merges", merges}}}};
}

TEST(HfBpeTokenizerTest, Llama2StyleMergesByRank) {
  auto t = FromJsonOrDie(Llama2Json());
  ASSERT_NE(t, nullptr);
  // "▁hello▁world": ▁ h → ▁h (rank 0), l l → ll, ▁h e → ▁he, ll o → llo,
  // ▁he llo → ▁hello; ▁ w → ▁w, o r → or, ▁w or → ▁wor, l d → ld,
  // ▁wor ld → ▁world.
  EXPECT_THAT(t->Encode("hello world"), ElementsAre(268, 276));
  EXPECT_EQ(t->Decode({268, 276}), "hello world");
  // "▁lll": both l l pairs have the same rank; the leftmost merges first.
  EXPECT_THAT(t->Encode("lll"), ElementsAre(259, 265, 262));
  EXPECT_EQ(t->vocab_size(), 277);
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_EQ(t->pad_id(), -1);
  EXPECT_TRUE(t->add_bos());  // the template starts with <s>
  EXPECT_THAT(t->EncodeForPrompt("hello"), ElementsAre(1, 268));
  EXPECT_TRUE(t->Encode("").empty());
}

TEST(HfBpeTokenizerTest, Llama2StyleByteFallback) {
  auto t = FromJsonOrDie(Llama2Json());
  ASSERT_NE(t, nullptr);
  // "▁hi▁😀": i is not in the vocab → <0x69>; 😀 = F0 9F 98 80 → four byte
  // pieces; ▁ h merges to ▁h.
  const std::vector<int32_t> ids = t->Encode("hi 😀");
  EXPECT_THAT(ids, ElementsAre(264, kByteBase + 0x69, 259, kByteBase + 0xF0, kByteBase + 0x9F, kByteBase + 0x98,
                               kByteBase + 0x80));
  EXPECT_EQ(t->Decode(ids), "hi 😀");
  // A broken byte run decodes to one U+FFFD per byte (Hugging Face's rule).
  EXPECT_EQ(t->Decode({268, kByteBase + 0xF0, kByteBase + 0x9F, 276}), "hello\xEF\xBF\xBD\xEF\xBF\xBD world");
}

TEST(HfBpeTokenizerTest, Llama2StyleAddedTokensAndSpecialDecoding) {
  auto t = FromJsonOrDie(Llama2Json());
  ASSERT_NE(t, nullptr);
  // Added tokens split the text before normalization, so each side gets its
  // own ▁ prefix: "<s>" + "▁hello" + "</s>" + "▁world".
  EXPECT_THAT(t->Encode("<s>hello</s>world"), ElementsAre(1, 268, 2, 276));
  // Special tokens decode to nothing; out-of-range ids are skipped.
  EXPECT_EQ(t->Decode({1, 268, 2, -5, 100000}), "hello");
  EXPECT_EQ(t->PieceToId("</s>"), 2);
  EXPECT_EQ(t->PieceToId(M("hello")), 268);
  EXPECT_EQ(t->IdToPiece(276), M("world"));
  EXPECT_EQ(t->IdToPiece(9999), "");
}

TEST(HfBpeTokenizerTest, UnknownCharactersWithoutByteFallback) {
  auto fused = FromJsonOrDie(Llama2Json(/*byte_fallback=*/false, /*fuse_unk=*/true));
  auto unfused = FromJsonOrDie(Llama2Json(/*byte_fallback=*/false, /*fuse_unk=*/false));
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(unfused, nullptr);
  // "▁hxyz": ▁h, then x y z unknown: one <unk> when fused, three otherwise.
  EXPECT_THAT(fused->Encode("hxyz"), ElementsAre(264, 0));
  EXPECT_THAT(unfused->Encode("hxyz"), ElementsAre(264, 0, 0, 0));
  // <unk> is special, so it decodes to nothing.
  EXPECT_EQ(fused->Decode({264, 0}), "h");
}

TEST(HfBpeTokenizerTest, MergesInArrayForm) {
  Json json = Llama2Json();
  Json merges = Json::array();
  for (const Json& m : json["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    merges.push_back(Json::array({s.substr(0, space), s.substr(space + 1)}));
  }
  json["model"]["merges"] = merges;
  auto t = FromJsonOrDie(json);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hello world"), ElementsAre(268, 276));
}

TEST(HfBpeTokenizerTest, MetaspacePreTokenizer) {
  // The newer Llama / Mistral layout: no normalizer, Metaspace with
  // prepend_scheme "first" (only the start of the text gets ▁).
  Json json = Llama2Json();
  json["normalizer"] = nullptr;
  json["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", false}};
  json["decoder"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}};
  auto t = FromJsonOrDie(json);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hello world"), ElementsAre(268, 276));
  // After an added token the segment is not at the start: no ▁ → h e llo.
  EXPECT_THAT(t->Encode("<s>hello"), ElementsAre(1, 260, 261, 267));
  EXPECT_EQ(t->Decode({268, 276}), "hello world");
}

// ---------------------------------------------------------------------------
// Byte-level BPE (GPT-2 / Llama-3): ids 0..255 are the byte alphabet in byte
// order (so a byte's id is its value), merges add ids from 256.

std::string ByteChar(uint8_t b) {
  // GPT-2: printable Latin-1 stands for itself; 0x20 (space) is Ġ (U+0120),
  // 0x0A is Ċ (U+010A).
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  char32_t cp = b;
  if (!printable) {
    char32_t next = 256;
    for (int x = 0; x < b; ++x) {
      const bool p = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
      if (!p) ++next;
    }
    cp = next;
  }
  std::string out;
  AppendUtf8(cp, &out);
  return out;
}

std::string ByteChars(const std::string& bytes) {
  std::string out;
  for (char c : bytes) out += ByteChar(static_cast<uint8_t>(c));
  return out;
}

Json ByteLevelJson(const std::vector<std::pair<std::string, std::string>>& merge_pairs, const Json& pre_tokenizer) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(static_cast<uint8_t>(b))] = b;
  Json merges = Json::array();
  int next_id = 256;
  for (const auto& [a, b] : merge_pairs) {
    merges.push_back(absl::StrCat(ByteChars(a), " ", ByteChars(b)));
    const std::string merged = ByteChars(a + b);
    if (!vocab.contains(merged)) vocab[merged] = next_id++;
  }
  return {{"added_tokens", Json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

TEST(HfBpeTokenizerTest, Gpt2StyleByteLevel) {
  const Json json =
      ByteLevelJson({{"T", "h"},    // 256 Th
                     {"i", "s"},    // 257 is
                     {"Th", "is"},  // 258 This
                     {" ", "is"},   // 259 Ġis
                     {" ", "t"},    // 260 Ġt
                     {"h", "e"},    // 261 he
                     {" t", "he"},  // 262 Ġthe
                     {"e", "s"},    // 263 es
                     {" t", "es"},  // 264 Ġtes
                     {"'", "s"},    // 265 's
                     {"1", "2"}},   // 266 12
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}});
  auto t = FromJsonOrDie(json);
  ASSERT_NE(t, nullptr);
  // GPT-2 split: "This" " is" " the" " test" "'s" " 123" " end" "\n".
  //  This → T h i s → Th, is → This (258)
  //  Ġis → Ġ is → Ġis (259)
  //  Ġthe → Ġt (rank 4) then he (rank 5) → Ġthe (262)
  //  Ġtest → Ġt, es, Ġtes (264) + t (116)
  //  's → 265; Ġ123 → Ġ(32) 12(266) 3(51); Ġend → bytes; \n → 10.
  const std::string text = "This is the test's 123 end\n";
  const std::vector<int32_t> ids = t->Encode(text);
  EXPECT_THAT(ids, ElementsAre(258, 259, 262, 264, 116, 265, 32, 266, 51, 32, 101, 110, 100, 10));
  EXPECT_EQ(t->Decode(ids), text);
  EXPECT_FALSE(t->add_bos());
  // Multi-byte characters are their UTF-8 bytes; half a character decodes to
  // U+FFFD.
  EXPECT_THAT(t->Encode("é"), ElementsAre(0xC3, 0xA9));
  EXPECT_EQ(t->Decode({0xC3}), "\xEF\xBF\xBD");
  EXPECT_EQ(t->Decode({0xC3, 0xA9}), "é");
}

TEST(HfBpeTokenizerTest, ByteLevelAddPrefixSpace) {
  const Json json = ByteLevelJson({{" ", "h"}, {" h", "i"}},  // 256 Ġh, 257 Ġhi
                                  {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}});
  auto t = FromJsonOrDie(json);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hi"), ElementsAre(257));
  EXPECT_THAT(t->Encode(" hi"), ElementsAre(257));  // already starts with a space
}

Json Llama3PreTokenizer() {
  return {
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array(
           {{{"type", "Split"},
             {"pattern",
              {{"Regex",
                R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
}

TEST(HfBpeTokenizerTest, Llama3StyleSplitIgnoreMergesAndSpecialTokens) {
  Json json = ByteLevelJson({{"H", "i"}}, Llama3PreTokenizer());  // 256 Hi
  // A whole-word entry reachable by no merge: only ignore_merges finds it.
  json["model"]["vocab"][ByteChars(" world")] = 257;
  json["model"]["ignore_merges"] = true;
  json["added_tokens"] = Json::array({{{"id", 300}, {"content", "<|begin_of_text|>"}, {"special", true}},
                                      {{"id", 301}, {"content", "<|end_of_text|>"}, {"special", true}},
                                      {{"id", 302}, {"content", "<|eot_id|>"}, {"special", true}}});
  json["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       Json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true}},
                    {{"type", "TemplateProcessing"},
                     {"single", Json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"special_tokens",
                      {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", Json::array({300})}}}}}}})}};
  auto t = FromJsonOrDie(json);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 303);
  EXPECT_EQ(t->bos_id(), 300);
  EXPECT_EQ(t->eos_id(), 301);  // by name: <|end_of_text|>
  EXPECT_TRUE(t->add_bos());
  EXPECT_EQ(t->PieceToId("<|eot_id|>"), 302);
  // Split: "Hi" " world" "1234" → "123" "4"; special tokens taken literally.
  EXPECT_THAT(t->Encode("<|begin_of_text|>Hi world1234<|eot_id|>"),
              ElementsAre(300, 256, 257, '1', '2', '3', '4', 302));
  EXPECT_THAT(t->EncodeForPrompt("Hi"), ElementsAre(300, 256));
  EXPECT_EQ(t->Decode({300, 256, 257, 302}), "Hi world");
}

TEST(HfBpeTokenizerTest, UnsupportedComponentsAreInvalidArgument) {
  struct Case {
    const char* field;
    Json value;
    const char* type;
  };
  const std::vector<Case> cases = {
      {"normalizer", {{"type", "BertNormalizer"}}, "BertNormalizer"},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}, "BertPreTokenizer"},
      {"decoder", {{"type", "WordPiece"}}, "WordPiece"},
      {"post_processor", {{"type", "Mystery"}}, "Mystery"},
  };
  for (const Case& c : cases) {
    Json json = Llama2Json();
    json[c.field] = c.value;
    absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> t = HfBpeTokenizer::FromJson(json.dump(), "dir/tokenizer.json");
    ASSERT_FALSE(t.ok()) << c.field;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(c.type));
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("dir/tokenizer.json"));
  }
  Json wordpiece = Llama2Json();
  wordpiece["model"]["type"] = "WordPiece";
  absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> t = HfBpeTokenizer::FromJson(wordpiece.dump(), "dir/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("WordPiece"));

  Json regex = ByteLevelJson({}, {{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+"}}}, {"behavior", "Isolated"}});
  t = HfBpeTokenizer::FromJson(regex.dump(), "dir/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("[a-z]+"));
}

TEST(HfBpeTokenizerTest, MalformedJsonIsInvalidArgument) {
  for (const std::string& text :
       {std::string("{not json"), std::string("[]"), std::string("{}"),
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})"),
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})"),
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}, "merges": []}})"),
        std::string(R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})")}) {
    absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> t = HfBpeTokenizer::FromJson(text, "bad/tokenizer.json");
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("bad/tokenizer.json"));
  }
}

// ---------------------------------------------------------------------------
// The hand-written pre-tokenizer regexes.

std::vector<std::string> SplitWith(const std::string& text, PretokenizerRegex kind) {
  std::vector<std::string> pieces;
  for (const auto& [begin, end] : FindPretokenizerMatches(text, kind)) {
    pieces.push_back(text.substr(begin, end - begin));
  }
  return pieces;
}

TEST(HfBpeTokenizerTest, Gpt2RegexSplits) {
  EXPECT_THAT(SplitWith("Hello  world's 42nd!!\n", PretokenizerRegex::kGpt2),
              ElementsAre("Hello", " ", " world", "'s", " 42", "nd", "!!", "\n"));
  // Case-sensitive contractions; trailing spaces stay together at the end.
  EXPECT_THAT(SplitWith("I'M ok   ", PretokenizerRegex::kGpt2), ElementsAre("I", "'", "M", " ok", "   "));
  EXPECT_THAT(SplitWith("naïve café 東京", PretokenizerRegex::kGpt2), ElementsAre("naïve", " café", " 東京"));
}

TEST(HfBpeTokenizerTest, Llama3RegexSplits) {
  EXPECT_THAT(SplitWith("Hello  world!!\n\n123456 it's I'M ok", PretokenizerRegex::kLlama3),
              ElementsAre("Hello", " ", " world", "!!\n\n", "123", "456", " it", "'s", " I", "'M", " ok"));
  // \s*[\r\n]+ ends after the last newline of a whitespace run.
  EXPECT_THAT(SplitWith("a \n \n  b", PretokenizerRegex::kLlama3), ElementsAre("a", " \n \n", " ", " b"));
  EXPECT_THAT(SplitWith("x12345", PretokenizerRegex::kLlama3SingleDigit), ElementsAre("x", "1", "2", "3", "4", "5"));
  EXPECT_THAT(SplitWith("(foo) Ωμέγα", PretokenizerRegex::kLlama3), ElementsAre("(foo", ")", " Ωμέγα"));
}

}  // namespace
}  // namespace strata::policies
