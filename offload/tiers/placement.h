// Where one model's state lives: the per-model placement that a job spec
// names for the actor, reference, reward model and critic.
#ifndef STRATA_OFFLOAD_TIERS_PLACEMENT_H_
#define STRATA_OFFLOAD_TIERS_PLACEMENT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/tiers/tier_accounting.h"

namespace strata::offload {

struct ModelPlacement {
  // Decoder layer weights: kDevice keeps them resident; kHost / kNvme stream
  // them layer by layer from the host arena / the NVMe store.
  Tier weights = Tier::kDevice;
  // fp32 master weights and Adam moments: kDevice (updated by torch ops on
  // the device), kHost (CPU Adam over the host arena) or kNvme (tiles
  // swapped through host staging around CPU Adam).
  Tier optimizer = Tier::kHost;
  // Where gradients accumulate: kDevice (with a device optimizer) or kHost
  // (fp32, moved off the device as each layer finishes).
  Tier gradients = Tier::kHost;
  // Where a training step keeps each decoder layer's input between forward
  // and backward (SSDTrain): kDevice, or kHost / kNvme with a window of
  // about three on the device, brought back one layer ahead of backward.
  // Only a model that trains keeps any.
  Tier activations = Tier::kDevice;
  // Layers fetched ahead of the one computing when weights stream.
  int prefetch_depth = 1;
  // The optimizer updates each decoder layer as soon as its backward ends
  // (Fuyou's overlap): that layer's gradient is final then, so no gradient
  // buffer for the layers exists, only one layer's at a time. Needs a host
  // or NVMe optimizer, one forward-backward per step (no micro-batches), no
  // gradient clipping and one rank; the job spec checks those.
  bool step_in_backward = false;

  // INVALID_ARGUMENT naming the field for combinations that cannot work:
  // device gradients need the device optimizer, and a device optimizer needs
  // device gradients and resident weights.
  absl::Status Validate() const;

  // "weights=host optimizer=nvme gradients=host prefetch=1".
  std::string ToString() const;
};

// The compute device a job names: "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N;
// INVALID_ARGUMENT naming `text` otherwise. Torch-free, for spec parsing;
// ParseComputeDevice (device_transfer.h) builds the at::Device from it.
absl::StatusOr<int> ParseDeviceName(const std::string& text);

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_TIERS_PLACEMENT_H_
