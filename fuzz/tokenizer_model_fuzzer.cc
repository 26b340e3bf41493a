// A SentencePiece tokenizer.model (protobuf bytes, parsed by our own reader).
#include "fuzz/fuzz_util.h"
#include "policies/tokenizer/sentencepiece_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto proto = strata::policies::ParseSentencePieceModelProto(bytes, "tokenizer.model");
  if (!proto.ok()) return 0;
  auto tokenizer = strata::policies::SentencePieceTokenizer::FromProto(std::move(*proto), "tokenizer.model");
  if (tokenizer.ok()) {
    const auto ids = (*tokenizer)->Encode("Hello, wörld! 123  日本語 🙂");
    (void)(*tokenizer)->Decode(ids);
    (void)(*tokenizer)->Decode({0, 1, 2, -1, 1 << 30});
  }
  return 0;
}
