// A checkpoint's state.json, as --resume and a requeued job read it.
#include "fuzz/fuzz_util.h"
#include "services/rank/checkpoint_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto state = strata::services::ParseCheckpointState(text, "iter-000004", 4);
  if (state.ok()) strata::fuzz::Check(state->metrics_lines >= 0 && state->metrics_lines <= 4, "metrics_lines range");
  return 0;
}
