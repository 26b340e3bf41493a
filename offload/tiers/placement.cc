#include "offload/tiers/placement.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::offload {

absl::Status ModelPlacement::Validate() const {
  if (gradients == Tier::kNvme) {
    return absl::InvalidArgumentError("placement.gradients must be device or host, not nvme");
  }
  if (gradients == Tier::kDevice && optimizer != Tier::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat("placement.gradients=device needs placement.optimizer=device (got ",
                                                   TierName(optimizer),
                                                   "): a host or NVMe optimizer reads host gradients"));
  }
  if (optimizer == Tier::kDevice && gradients != Tier::kDevice) {
    return absl::InvalidArgumentError("placement.optimizer=device needs placement.gradients=device");
  }
  if (optimizer == Tier::kDevice && weights != Tier::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat("placement.optimizer=device needs placement.weights=device (got ",
                                                   TierName(weights), "): streamed weights have no device master"));
  }
  if (step_in_backward && optimizer == Tier::kDevice) {
    return absl::InvalidArgumentError(
        "placement.step_in_backward needs a host or NVMe optimizer (the device optimizer keeps device gradients)");
  }
  if (prefetch_depth < 0) {
    return absl::InvalidArgumentError(absl::StrCat("placement.prefetch_depth must be >= 0, got ", prefetch_depth));
  }
  return absl::OkStatus();
}

std::string ModelPlacement::ToString() const {
  return absl::StrCat("weights=", TierName(weights), " optimizer=", TierName(optimizer),
                      " gradients=", TierName(gradients), " prefetch=", prefetch_depth,
                      activations != Tier::kDevice ? absl::StrCat(" activations=", TierName(activations)) : "",
                      step_in_backward ? " step_in_backward" : "");
}

absl::StatusOr<int> ParseDeviceName(const std::string& text) {
  if (text == "cpu") return -1;
  if (text == "cuda") return 0;
  int index = -1;
  if (text.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(text.substr(5), &index) && index >= 0 && index < 64) {
    return index;
  }
  return absl::InvalidArgumentError(absl::StrCat("device \"", text, "\": expected cpu, cuda or cuda:N"));
}

}  // namespace strata::offload
