// A model's config.json.
#include "fuzz/fuzz_util.h"
#include "policies/config/llama_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = strata::policies::LlamaConfig::FromJson(text, "config.json");
  if (config.ok()) {
    // A config that loads must survive its own round trip.
    auto again = strata::policies::LlamaConfig::FromJson(config->ToJson(false), "config.json");
    strata::fuzz::Check(again.ok(), "config round trip");
  }
  return 0;
}
