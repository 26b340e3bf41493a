// A tokenizer.json (BPE, byte-level or SentencePiece-style) and, after
// "\n----\n", a tokenizer_config.json; the tokenizer then encodes and
// decodes a mixed-script text.
#include "fuzz/fuzz_util.h"
#include "policies/tokenizer/bpe_tokenizer.h"
#include "policies/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto [json, config] = strata::fuzz::SplitOnce(in);
  if (!config.empty()) (void)strata::policies::ParseTokenizerConfig(std::string(config), "tokenizer_config.json");
  auto tokenizer = strata::policies::HfBpeTokenizer::FromJson(std::string(json), "tokenizer.json");
  if (tokenizer.ok()) {
    const auto ids = (*tokenizer)->Encode("Hello, wörld! 123  \t日本語 🙂 e\xCC\x81 <s>x</s>");
    (void)(*tokenizer)->Decode(ids);
    (void)(*tokenizer)->Decode({0, 1, 2, -1, 1 << 30});  // ids outside the vocabulary
  }
  return 0;
}
