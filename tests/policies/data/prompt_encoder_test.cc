// Encoding a job's text: over-long prompts keep their end, responses end
// with EOS within max_response_tokens.
#include "policies/data/prompt_encoder.h"

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

// One id per byte, 1 = BOS, 2 = EOS (or none).
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int32_t eos) : eos_(eos) {}
  std::vector<int32_t> Encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(static_cast<int32_t>(c));
    return ids;
  }
  std::string Decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    for (int32_t id : ids) text.push_back(static_cast<char>(id));
    return text;
  }
  int32_t vocab_size() const override { return 256; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return eos_; }
  int32_t pad_id() const override { return -1; }
  int32_t PieceToId(const std::string&) const override { return -1; }
  std::string IdToPiece(int32_t) const override { return ""; }

 private:
  const int32_t eos_;
};

DataSpec Lengths(int64_t prompt, int64_t response) {
  DataSpec data;
  data.max_prompt_tokens = prompt;
  data.max_response_tokens = response;
  return data;
}

std::vector<int32_t> Ids(const std::string& text) { return ByteTokenizer(2).Encode(text); }

TEST(PromptEncoderTest, AnOverLongPromptKeepsItsEnd) {
  ByteTokenizer tokenizer(2);
  tokenizer.set_add_bos(true);
  const PromptEncoder encode(tokenizer, Lengths(4, 8));
  std::vector<int32_t> short_prompt = {1};
  const auto ab = Ids("ab");
  short_prompt.insert(short_prompt.end(), ab.begin(), ab.end());
  EXPECT_EQ(encode.Prompt("ab"), short_prompt);  // BOS kept when it fits
  EXPECT_EQ(encode.Prompt("abcdef"), Ids("cdef"));
}

TEST(PromptEncoderTest, AnOverLongPromptIsDroppedWhenTheSpecSaysSo) {
  ByteTokenizer tokenizer(2);
  DataSpec data = Lengths(4, 8);
  data.overlong_prompts = "drop";
  const PromptEncoder encode(tokenizer, data);
  EXPECT_EQ(encode.Prompt("abcd"), Ids("abcd"));
  EXPECT_EQ(encode.Prompt("abcde"), std::nullopt);
  EXPECT_EQ(encode.FitPrompt(Ids("abcdef")), std::nullopt);
}

TEST(PromptEncoderTest, AResponseEndsWithEosWithinItsLimit) {
  ByteTokenizer tokenizer(2);
  const PromptEncoder encode(tokenizer, Lengths(4, 4));
  auto with_eos = [](std::vector<int32_t> ids) {
    ids.push_back(2);
    return ids;
  };
  EXPECT_EQ(encode.Response("ab"), with_eos(Ids("ab")));
  EXPECT_EQ(encode.Response("abcdef"), with_eos(Ids("abc")));
}

TEST(PromptEncoderTest, WithoutEosAResponseIsOnlyCut) {
  ByteTokenizer tokenizer(-1);
  const PromptEncoder encode(tokenizer, Lengths(4, 4));
  EXPECT_EQ(encode.Response("abcdef"), Ids("abc"));
}

}  // namespace
}  // namespace strata::policies
