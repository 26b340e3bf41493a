#include "policies/config/galore_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "policies/config/lora_config.h"

namespace strata::policies {

namespace {
constexpr LoraModule kProjections[] = {LoraModule::kQ,    LoraModule::kK,  LoraModule::kV,   LoraModule::kO,
                                       LoraModule::kGate, LoraModule::kUp, LoraModule::kDown};

// Sums f(rows, cols) over every decoder-layer projection of `model`.
template <typename F>
double OverProjections(const LlamaConfig& model, F f) {
  double total = 0;
  for (LoraModule m : kProjections) {
    const auto [rows, cols] = LoraModuleShape(model, m);
    total += f(rows, cols);
  }
  return total * static_cast<double>(model.num_hidden_layers);
}
}  // namespace

int64_t GaloreConfig::RankFor(int64_t rows, int64_t cols) const { return std::min({rank, rows, cols}); }

int64_t GaloreConfig::StateElements(int64_t rows, int64_t cols) const {
  const int64_t r = RankFor(rows, cols);
  const int64_t kept = ProjectsRows(rows, cols) ? cols : rows;  // the side the moments keep
  const int64_t projected = ProjectsRows(rows, cols) ? rows : cols;
  return 2 * r * kept + projected * r;
}

int64_t GaloreConfig::ProjectedParameters(const LlamaConfig& model) const {
  return static_cast<int64_t>(OverProjections(model, [](int64_t rows, int64_t cols) { return double(rows * cols); }));
}

int64_t GaloreConfig::StateElements(const LlamaConfig& model) const {
  if (!enabled()) return 0;
  return static_cast<int64_t>(
      OverProjections(model, [&](int64_t rows, int64_t cols) { return double(StateElements(rows, cols)); }));
}

int64_t GaloreConfig::SavedBytes(const LlamaConfig& model) const {
  if (!enabled()) return 0;
  return 8 * ProjectedParameters(model) - 4 * StateElements(model);
}

double GaloreConfig::StepFlops(const LlamaConfig& model) const {
  if (!enabled()) return 0;
  return OverProjections(model, [&](int64_t rows, int64_t cols) {
    return 4.0 * static_cast<double>(rows) * static_cast<double>(cols) * static_cast<double>(RankFor(rows, cols));
  });
}

double GaloreConfig::RefreshFlops(const LlamaConfig& model) const {
  if (!enabled()) return 0;
  return OverProjections(model, [&](int64_t rows, int64_t cols) {
    // Six passes over the matrix with k = r + oversampling columns, then
    // the SVD of the k x (long side) sketch.
    const double small = static_cast<double>(std::min(rows, cols)), large = static_cast<double>(std::max(rows, cols));
    const double k = std::min(small, static_cast<double>(RankFor(rows, cols) + 8));
    return 12.0 * small * large * k + 6.0 * large * k * k;
  });
}

absl::Status GaloreConfig::Validate(const std::string& key) const {
  auto error = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, ".", field, "' ", why));
  };
  if (rank < 1) return error("rank", absl::StrCat("must be at least 1, got ", rank));
  if (update_proj_gap < 1) return error("update_proj_gap", absl::StrCat("must be at least 1, got ", update_proj_gap));
  if (!(scale > 0) || !std::isfinite(scale)) return error("scale", absl::StrCat("must be positive, got ", scale));
  return absl::OkStatus();
}

}  // namespace strata::policies
