// Tokenizer::Load dispatch, tokenizer_config.json handling, error statuses,
// and the hand-written ModelProto parser on models built byte by byte here.
#include "policies/tokenizer/tokenizer.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/tokenizer/sentencepiece_model.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using ::strata::testing::TempDir;
using ::strata::testing::WriteTextFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// --- A minimal protobuf writer, to build tokenizer.model files by hand. ---

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
std::string Tag(uint32_t field, int wire_type) { return Varint((field << 3) | wire_type); }
std::string VarintField(uint32_t field, int64_t v) {
  return Tag(field, 0) + Varint(static_cast<uint64_t>(v));  // negative: 10 bytes
}
std::string BytesField(uint32_t field, const std::string& bytes) {
  return Tag(field, 2) + Varint(bytes.size()) + bytes;
}
std::string FloatField(uint32_t field, float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, 4);
  std::string out = Tag(field, 5);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  return out;
}

std::string PieceMessage(const std::string& piece, float score, int type) {
  return BytesField(1, BytesField(1, piece) + FloatField(2, score) + VarintField(3, type));
}

constexpr const char* kMeta = "\xE2\x96\x81";  // ▁

// A BPE model with identity normalization:
//   0 <unk>  1 <s>  2 </s>  3 ▁  4 a  5 b  6 ▁a (-1)  7 ab (-2)  8 ▁ab (-3)
// plus unknown fields of every wire type sprinkled in, which must be skipped.
std::string TinyBpeModel() {
  std::string model;
  model += PieceMessage("<unk>", 0, 2);
  model += PieceMessage("<s>", 0, 3);
  model += PieceMessage("</s>", 0, 3);
  model += PieceMessage(kMeta, -4, 1);
  model += Tag(99, 0) + Varint(12345);  // unknown varint
  model += PieceMessage("a", -5, 1);
  model += Tag(98, 1) + std::string(8, '\x7f');  // unknown fixed64
  model += PieceMessage("b", -6, 1);
  model += Tag(97, 3) + VarintField(1, 7) + BytesField(2, "xyz") + Tag(97, 4);  // group
  model += PieceMessage(absl::StrCat(kMeta, "a"), -1, 1);
  model += Tag(96, 5) + std::string(4, '\x01');  // unknown fixed32
  model += PieceMessage("ab", -2, 1);
  model += PieceMessage(absl::StrCat(kMeta, "ab"), -3, 1);
  const std::string trainer = VarintField(3, 2)  // model_type = BPE
                              + BytesField(1, "corpus.txt") + VarintField(4, 9) + VarintField(40, 0) +
                              VarintField(41, 1) + VarintField(42, 2) + VarintField(43, -1) +
                              BytesField(200, "extension");
  model += BytesField(2, trainer);
  const std::string normalizer = BytesField(1, "identity") + VarintField(3, 1) + VarintField(4, 0) + VarintField(5, 1);
  model += BytesField(3, normalizer);
  return model;
}

// Writes `model` as <dir>/tokenizer.model and returns the path.
std::string WriteModel(const TempDir& dir, const std::string& model) {
  const std::string path = dir.Join("tokenizer.model");
  WriteTextFile(path, model);
  return path;
}

TEST(TokenizerTest, ParsesHandBuiltModelAndSkipsUnknownFields) {
  absl::StatusOr<SentencePieceModelProto> proto = ParseSentencePieceModelProto(TinyBpeModel(), "tiny.model");
  ASSERT_TRUE(proto.ok()) << proto.status();
  ASSERT_EQ(proto->pieces.size(), 9u);
  EXPECT_EQ(proto->pieces[6].piece, absl::StrCat(kMeta, "a"));
  EXPECT_FLOAT_EQ(proto->pieces[6].score, -1.0f);
  EXPECT_EQ(proto->pieces[1].type, SentencePieceModelProto::PieceType::kControl);
  EXPECT_EQ(proto->model_type, SentencePieceModelProto::ModelType::kBpe);
  EXPECT_EQ(proto->pad_id, -1);  // a 10-byte negative varint
  EXPECT_EQ(proto->normalizer_name, "identity");
  EXPECT_TRUE(proto->add_dummy_prefix);
  EXPECT_FALSE(proto->remove_extra_whitespaces);
  EXPECT_FALSE(proto->byte_fallback);
}

TEST(TokenizerTest, HandBuiltBpeModelEncodesByScore) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(WriteModel(dir, TinyBpeModel()));
  ASSERT_TRUE(t.ok()) << t.status();
  // "▁ab▁ab": ▁a (score -1) merges first, leftmost first, then ▁a+b → ▁ab.
  EXPECT_THAT((*t)->Encode("ab ab"), ElementsAre(8, 8));
  // "▁ba": no ▁b piece and b+a is unknown: ▁ b a.
  EXPECT_THAT((*t)->Encode("ba"), ElementsAre(3, 5, 4));
  // "▁abc": c is unknown → <unk>.
  EXPECT_THAT((*t)->Encode("abc"), ElementsAre(8, 0));
  EXPECT_EQ((*t)->Decode({1, 8, 8, 2}), "ab ab");
  EXPECT_EQ((*t)->Decode({8, 0, 8}), "ab \xE2\x81\x87  ab");  // <unk> → " ⁇ "
  EXPECT_EQ((*t)->Decode({8, -1, 42, 8}), "ab ab");           // out of range: skipped
  EXPECT_EQ((*t)->vocab_size(), 9);
  EXPECT_EQ((*t)->bos_id(), 1);
  EXPECT_EQ((*t)->eos_id(), 2);
  EXPECT_EQ((*t)->pad_id(), -1);
  // No tokenizer_config.json: SentencePiece models add BOS (Llama-2).
  EXPECT_TRUE((*t)->add_bos());
  EXPECT_THAT((*t)->EncodeForPrompt("ab"), ElementsAre(1, 8));
  EXPECT_TRUE((*t)->Encode("").empty());
  EXPECT_THAT((*t)->EncodeForPrompt(""), ElementsAre(1));
}

// Ids spm_encode prints for `text` with `model_path`; nullopt (with a test
// failure) when it cannot run.
std::optional<std::vector<int32_t>> SpmEncode(const TempDir& dir, const std::string& model_path,
                                              const std::string& text) {
  const std::string input = dir.Join("input.txt");
  WriteTextFile(input, text + "\n");
  absl::StatusOr<testing::CommandResult> result = testing::RunCommand(
      {"spm_encode", absl::StrCat("--model=", model_path), "--output_format=id", absl::StrCat("--input=", input)});
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok() || result->exit_code != 0) {
    ADD_FAILURE() << "spm_encode failed";
    return std::nullopt;
  }
  std::vector<int32_t> ids;
  std::istringstream stream(result->output);
  for (int32_t id; stream >> id;) ids.push_back(id);
  return ids;
}

TEST(TokenizerTest, UnusedPiecesMatchSpmEncode) {
  if (!testing::HaveProgram("spm_encode")) GTEST_SKIP() << "spm_encode not installed";
  // BPE: "ab" is UNUSED, so a merge that ends on it is split back into a b;
  // it still serves as a step towards "abc".
  //   0 <unk> 1 <s> 2 </s> 3 ▁ 4 a 5 b 6 c 7 ab (unused) 8 abc 9 ▁abc
  auto bpe_model = [](int model_type) {
    std::string model = PieceMessage("<unk>", 0, 2) + PieceMessage("<s>", 0, 3) + PieceMessage("</s>", 0, 3) +
                        PieceMessage(kMeta, -5, 1) + PieceMessage("a", -6, 1) + PieceMessage("b", -7, 1) +
                        PieceMessage("c", -8, 1) + PieceMessage("ab", -1, 5) + PieceMessage("abc", -2, 1) +
                        PieceMessage(absl::StrCat(kMeta, "abc"), -3, 1);
    model += BytesField(2, VarintField(3, model_type));
    model += BytesField(3, BytesField(1, "identity"));
    return model;
  };
  for (const int model_type : {1, 2}) {  // unigram, BPE
    SCOPED_TRACE(model_type == 1 ? "unigram" : "bpe");
    TempDir dir;
    const std::string path = WriteModel(dir, bpe_model(model_type));
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(path);
    ASSERT_TRUE(t.ok()) << t.status();
    for (const std::string text : {"ab", "abc", "abab c", "cab", "b a ab abc abcab", "xab"}) {
      const std::optional<std::vector<int32_t>> expected = SpmEncode(dir, path, text);
      ASSERT_TRUE(expected.has_value());
      EXPECT_EQ((*t)->Encode(text), *expected) << text;
    }
  }
}

TEST(TokenizerTest, TokenizerConfigSetsBosAndEos) {
  TempDir dir;
  WriteModel(dir, TinyBpeModel());
  WriteTextFile(dir.Join("tokenizer_config.json"),
                R"({"add_bos_token": false, "add_eos_token": true,
                    "bos_token": {"__type": "AddedToken", "content": "<s>"},
                    "eos_token": "</s>", "pad_token": null, "legacy": false})");
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE((*t)->add_bos());
  EXPECT_TRUE((*t)->add_eos());
  EXPECT_THAT((*t)->EncodeForPrompt("ab"), ElementsAre(8));
  EXPECT_EQ((*t)->pad_id(), -1);
}

TEST(TokenizerTest, DirectoryPrefersTokenizerJson) {
  TempDir dir;
  WriteModel(dir, TinyBpeModel());
  // A byte-level vocabulary of just "a", "b" and "ab" with id 7 for "ab".
  const nlohmann::json json = {
      {"model",
       {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 7}}}, {"merges", nlohmann::json::array({"a b"})}}}};
  WriteTextFile(dir.Join("tokenizer.json"), json.dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT((*t)->Encode("ab"), ElementsAre(7));
  // tokenizer.json without a template: no BOS by default.
  EXPECT_FALSE((*t)->add_bos());
  EXPECT_EQ((*t)->bos_id(), -1);

  WriteTextFile(dir.Join("tokenizer_config.json"), R"({"add_bos_token": true})");
  t = Tokenizer::Load(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->add_bos());
  // add_bos without a BOS token adds nothing.
  EXPECT_THAT((*t)->EncodeForPrompt("ab"), ElementsAre(7));
}

TEST(TokenizerTest, EmptyDirectoryIsNotFoundNamingIt) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(dir.path()));

  t = Tokenizer::Load(dir.Join("missing/tokenizer.model"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenizerTest, MalformedModelsAreInvalidArgumentNamingTheFile) {
  TempDir dir;
  const std::string model = TinyBpeModel();
  // Random bytes, a model cut inside its last field, an empty file, a
  // well-formed message without an <unk> piece, and bad wire types.
  std::string random(1000, '\0');
  uint32_t x = 12345;
  for (char& c : random) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  const std::vector<std::string> bad = {
      random,
      model.substr(0, model.size() - 5),
      "",
      PieceMessage("a", 0, 1),
      Tag(1, 0) + Varint(5),                                            // pieces as a varint
      BytesField(1, BytesField(1, "a") + VarintField(3, 9)),            // unknown piece type
      std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),  // endless varint
      model + Tag(5, 4),                                                // stray end-group
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string path = WriteModel(dir, bad[i]);
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(path);
    ASSERT_FALSE(t.ok()) << "case " << i;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << "case " << i;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(path)) << "case " << i;
  }
}

TEST(TokenizerTest, InvalidJsonFilesAreInvalidArgumentNamingTheFile) {
  TempDir dir;
  WriteTextFile(dir.Join("tokenizer.json"), "{\"model\": ");
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(dir.Join("tokenizer.json")));

  TempDir other;
  WriteModel(other, TinyBpeModel());
  WriteTextFile(other.Join("tokenizer_config.json"), R"({"add_bos_token": "yes"})");
  t = Tokenizer::Load(other.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("tokenizer_config.json"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("add_bos_token"));
}

TEST(TokenizerTest, ParseTokenizerConfigReadsTokens) {
  absl::StatusOr<TokenizerConfig> config = ParseTokenizerConfig(
      R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"},
          "add_bos_token": null, "model_max_length": 1000000})",
      "tokenizer_config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->bos_token, "<|begin_of_text|>");
  EXPECT_EQ(config->eos_token, "<|eot_id|>");
  EXPECT_FALSE(config->add_bos_token.has_value());
  EXPECT_FALSE(config->pad_token.has_value());
}

}  // namespace
}  // namespace strata::policies
