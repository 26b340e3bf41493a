// The optimizer-state checkpoint (SaveState / LoadState). One safetensors
// file per rank, holding the parameters that rank holds: for a parameter
// with HF name N, fp32 tensors "N.master", "N.exp_avg" and "N.exp_avg_sq",
// each flat [numel], and metadata "step.N" (its Adam step count, decimal);
// the file's metadata also carries format = "strata-optimizer". A GaLore
// matrix keeps its moments in their projected shape, flat, and adds
// "N.galore_projection" (the projection, [rows or cols, r], flat).
#include "policies/train/layerwise_trainer_impl.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <array>
#include <map>
#include <span>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "policies/checkpoint/safetensors.h"
#include "policies/checkpoint/tensor_io.h"

namespace strata::policies {

using internal::HostView;

namespace {
// The state tensors' name suffixes, in the order master, exp_avg, exp_avg_sq.
constexpr std::array<const char*, 3> kStateSuffixes = {".master", ".exp_avg", ".exp_avg_sq"};
constexpr char kProjectionSuffix[] = ".galore_projection";
}  // namespace

absl::Status LayerwiseTrainerImpl::SaveState(const std::string& path) {
  TensorWriteBatch batch;
  std::map<std::string, std::string> metadata = {{"format", "strata-optimizer"}};
  for (ParamState& p : params_) {
    if (!p.held) continue;
    // A GaLore matrix's moments live in its projection's shape, not on the
    // optimizer's tier: only its master is read there.
    const bool galore = p.galore != nullptr;
    at::Tensor master, m, v;
    switch (options_.optimizer) {
      case offload::Tier::kDevice:
        master = p.device_master, m = p.device_exp_avg, v = p.device_exp_avg_sq;
        break;
      case offload::Tier::kHost:
        master = HostView(p.master, p.numel);
        if (!galore) m = HostView(p.exp_avg, p.numel), v = HostView(p.exp_avg_sq, p.numel);
        break;
      case offload::Tier::kNvme: {
        auto span = [&](at::Tensor& t) {
          t = at::empty({p.numel}, at::kFloat);
          return std::span<float>(t.data_ptr<float>(), static_cast<size_t>(p.numel));
        };
        STRATA_RETURN_IF_ERROR(galore ? nvme_adam_->ReadMaster(p.name, span(master))
                                      : nvme_adam_->ReadState(p.name, span(master), span(m), span(v)));
        break;
      }
    }
    if (galore) {
      m = p.galore->exp_avg().reshape({-1}), v = p.galore->exp_avg_sq().reshape({-1});
      STRATA_RETURN_IF_ERROR(batch.Add(p.name + kProjectionSuffix, p.galore->projection().reshape({-1})));
    }
    const std::array<const at::Tensor*, 3> state = {&master, &m, &v};
    for (size_t i = 0; i < state.size(); ++i) {
      STRATA_RETURN_IF_ERROR(batch.Add(p.name + kStateSuffixes[i], *state[i]));
    }
    metadata["step." + p.name] = std::to_string(p.step);
  }
  return WriteSafetensors(path, batch.entries(), metadata);
}

absl::Status LayerwiseTrainerImpl::LoadState(const std::vector<std::string>& paths) {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  for (const std::string& path : paths) {
    STRATA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    files.push_back(std::move(file));
  }
  for (ParamState& p : params_) {
    if (!p.held) continue;
    // The file (of whichever rank wrote this parameter's state) that has it.
    size_t which = 0;
    while (which < files.size() && files[which]->Find(p.name + kStateSuffixes[0]) == nullptr) ++which;
    if (which == files.size()) {
      return absl::InvalidArgumentError(absl::StrCat(absl::StrJoin(paths, ", "), ": no optimizer state for ", p.name));
    }
    const SafetensorsFile* file = files[which].get();
    const std::string& path = paths[which];
    // Each tensor's expected length: a GaLore matrix's moments and
    // projection have their own (a checkpoint of another rank, or of full
    // Adam, does not fit and is named).
    const bool galore = p.galore != nullptr;
    const int64_t moments = galore ? p.galore->exp_avg().numel() : p.numel;
    auto read = [&](const std::string& name, int64_t numel) -> absl::StatusOr<at::Tensor> {
      const TensorView* view = file->Find(name);
      if (view == nullptr)
        return absl::InvalidArgumentError(absl::StrCat(path, ": optimizer state has no tensor ", name));
      auto tensor = ToTensorWithShape(*view, {numel}, at::kFloat);
      if (!tensor.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": ", tensor.status().message(),
            galore || file->Find(p.name + kProjectionSuffix) != nullptr
                ? " (GaLore's state has another shape: was the checkpoint written with other galore settings?)"
                : ""));
      }
      return *tensor;
    };
    std::array<at::Tensor, 3> loaded;
    for (size_t i = 0; i < kStateSuffixes.size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(loaded[i], read(p.name + kStateSuffixes[i], i == 0 ? p.numel : moments));
    }
    if (galore) {
      STRATA_ASSIGN_OR_RETURN(auto projection, read(p.name + kProjectionSuffix, p.galore->projection().numel()));
      c10::NoGradGuard no_grad;
      p.galore->projection().copy_(projection.view(p.galore->projection().sizes()));
      p.galore->exp_avg().copy_(loaded[1].view(p.galore->exp_avg().sizes()));
      p.galore->exp_avg_sq().copy_(loaded[2].view(p.galore->exp_avg_sq().sizes()));
    } else if (file->Find(p.name + kProjectionSuffix) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", p.name,
                                                     " has GaLore state, but this run trains it with full Adam "
                                                     "(was galore removed from the spec?)"));
    }
    auto step = file->metadata().find("step." + p.name);
    if (step == file->metadata().end() || !absl::SimpleAtoi(step->second, &p.step)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": optimizer state has no step count for ", p.name));
    }
    // The master (and full Adam's moments) to where the optimizer keeps them.
    switch (options_.optimizer) {
      case offload::Tier::kDevice:
        p.device_master.copy_(loaded[0]);
        if (!galore) {
          p.device_exp_avg.copy_(loaded[1]);
          p.device_exp_avg_sq.copy_(loaded[2]);
        }
        break;
      case offload::Tier::kHost:
        HostView(p.master, p.numel).copy_(loaded[0]);
        if (!galore) {
          HostView(p.exp_avg, p.numel).copy_(loaded[1]);
          HostView(p.exp_avg_sq, p.numel).copy_(loaded[2]);
        }
        break;
      case offload::Tier::kNvme: {
        auto span = [&](const at::Tensor& t) {
          return std::span<const float>(t.data_ptr<float>(), static_cast<size_t>(p.numel));
        };
        STRATA_RETURN_IF_ERROR(galore
                                   ? nvme_adam_->WriteMaster(p.name, span(loaded[0]))
                                   : nvme_adam_->WriteState(p.name, span(loaded[0]), span(loaded[1]), span(loaded[2])));
        break;
      }
    }
    steps_taken_ = std::max(steps_taken_, p.step);
  }
  return absl::OkStatus();
}

}  // namespace strata::policies
