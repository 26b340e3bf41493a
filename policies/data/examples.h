// A job's examples once tokenized: what SFT and the reward model train on.
#ifndef STRATA_POLICIES_DATA_EXAMPLES_H_
#define STRATA_POLICIES_DATA_EXAMPLES_H_

#include <cstdint>
#include <vector>

namespace strata::policies {

// An SFT example: the loss is on the response's ids, all of them, or, for a
// conversation, those of its assistant turns (each with its end-of-turn).
struct TextPair {
  std::vector<int32_t> prompt;
  std::vector<int32_t> response;
  // Per response id: 1 = trained on. Empty: every id.
  std::vector<uint8_t> response_loss_mask;
};

struct PreferencePair {
  std::vector<int32_t> prompt;
  std::vector<int32_t> chosen;
  std::vector<int32_t> rejected;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DATA_EXAMPLES_H_
