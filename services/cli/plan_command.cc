#include "services/cli/plan_command.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/job/memory_plan.h"

namespace strata::services {
namespace {

using nlohmann::json;
using policies::JobPrediction;

std::string GiB(int64_t bytes) { return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30)); }

// Whether the role's optimizer fields apply (it is trained).
bool Trained(const JobPrediction& p, const std::string& role) {
  auto it = p.trainable.find(role);
  return it != p.trainable.end() && it->second;
}

json PeakJson(const std::array<int64_t, 3>& peak) {
  return {{"device", peak[0]}, {"host", peak[1]}, {"nvme", peak[2]}};
}

json PredictionJson(const JobPrediction& p) {
  json j;
  for (const auto& [role, placement] : p.placement) {
    j["placement"][role] = {
        {"weights", offload::TierName(placement.weights)},        {"optimizer", offload::TierName(placement.optimizer)},
        {"gradients", offload::TierName(placement.gradients)},    {"prefetch", placement.prefetch_depth},
        {"step_in_backward", placement.step_in_backward},         {"trainable", Trained(p, role)},
        {"activations", offload::TierName(placement.activations)}};
  }
  for (const auto& [role, owner] : p.shares_base_of) j["shares_base_of"][role] = owner;
  for (const auto& [role, rank] : p.galore_rank) j["galore_rank"][role] = rank;
  j["micro_batch_size"] = p.micro_batch_size;
  if (p.rollout_concurrency > 0) j["rollout_concurrency"] = p.rollout_concurrency;
  j["peak_bytes"] = PeakJson(p.peak);
  j["process_rss_bytes"] = p.process_rss_bytes;
  j["iteration_s"] = p.iteration_s;
  for (const auto& [name, phase] : p.phases) {
    j["phases"][name] = {{"peak_bytes", PeakJson(phase.peak)}, {"seconds", phase.seconds}};
  }
  return j;
}

std::string PlacementLine(const JobPrediction& p) {
  std::vector<std::string> parts;
  for (const auto& [role, placement] : p.placement) {
    const bool trained = Trained(p, role);
    parts.push_back(absl::StrCat(
        role, " ", offload::TierName(placement.weights),
        trained ? absl::StrCat("/", offload::TierName(placement.optimizer)) : "",
        placement.weights == offload::Tier::kDevice ? "" : absl::StrCat(" prefetch ", placement.prefetch_depth),
        trained && placement.step_in_backward ? " step-in-backward" : "",
        trained && placement.activations != offload::Tier::kDevice
            ? absl::StrCat(" activations ", offload::TierName(placement.activations))
            : ""));
  }
  return absl::StrCat(absl::StrJoin(parts, ", "), "; micro-batch ",
                      p.micro_batch_size > 0 ? absl::StrCat(p.micro_batch_size) : std::string("whole"));
}

std::string PredictionText(const JobPrediction& p) {
  std::string text = absl::StrFormat("  %-10s %-8s %-10s %-10s %-12s %-9s %s\n", "model", "weights", "optimizer",
                                     "gradients", "activations", "prefetch", "step in backward");
  for (const auto& [role, placement] : p.placement) {
    const bool trained = Trained(p, role);
    const bool streamed = placement.weights != offload::Tier::kDevice;
    text += absl::StrFormat("  %-10s %-8s %-10s %-10s %-12s %-9s %s\n", role, offload::TierName(placement.weights),
                            trained ? offload::TierName(placement.optimizer) : "-",
                            trained ? offload::TierName(placement.gradients) : "-",
                            trained ? offload::TierName(placement.activations) : "-",
                            streamed ? absl::StrCat(placement.prefetch_depth) : "-",
                            trained && placement.step_in_backward ? "yes" : "");
  }
  for (const auto& [role, owner] : p.shares_base_of) {
    text += absl::StrFormat("  %-10s the %s's frozen base (LoRA): no memory of its own\n", role, owner);
  }
  text += absl::StrFormat("  micro-batch: %s\n", p.micro_batch_size > 0 ? absl::StrCat(p.micro_batch_size, " rows")
                                                                        : std::string("the whole batch"));
  if (p.rollout_concurrency > 0) {
    text += absl::StrFormat("  rollout: %d continuation%s at once\n", p.rollout_concurrency,
                            p.rollout_concurrency == 1 ? "" : "s");
  }
  text += absl::StrFormat("  %-10s %12s %12s %12s %10s\n", "phase", "device", "host", "nvme", "time");
  for (const char* name : {"rollout", "score", "update"}) {
    auto it = p.phases.find(name);
    if (it == p.phases.end()) continue;
    text += absl::StrFormat("  %-10s %12s %12s %12s %9.2fs\n", name, GiB(it->second.peak[0]), GiB(it->second.peak[1]),
                            GiB(it->second.peak[2]), it->second.seconds);
  }
  text += absl::StrFormat("  %-10s %12s %12s %12s %9.2fs\n", "peak", GiB(p.peak[0]), GiB(p.peak[1]), GiB(p.peak[2]),
                          p.iteration_s);
  text += absl::StrFormat("  process peak RSS: %s\n", GiB(p.process_rss_bytes));
  return text;
}

absl::StatusOr<policies::HardwareFigures> Figures(const std::string& named) {
  if (!named.empty()) return policies::LoadHardwareFigures(named);
  const std::string path = DefaultFiguresPath();
  if (!path.empty() && IsRegularFile(path)) return policies::LoadHardwareFigures(path);
  return policies::BuiltInHardwareFigures();
}

}  // namespace

std::string DefaultFiguresPath() {
  if (const char* env = std::getenv("STRATA_FIGURES"); env != nullptr && *env != '\0') return env;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache != nullptr && *cache != '\0') {
    return JoinPath(JoinPath(cache, "strata"), "figures.json");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return JoinPath(JoinPath(home, ".cache/strata"), "figures.json");
  }
  return "";
}

absl::StatusOr<std::string> RunPlan(const PlanOptions& options) {
  if (!options.write.empty() && (options.fit.empty() || options.specs.size() != 1)) {
    return absl::InvalidArgumentError("--write needs --fit and exactly one spec");
  }
  STRATA_ASSIGN_OR_RETURN(const auto figures, Figures(options.figures));
  policies::Hardware hardware;
  if (!options.fit.empty()) {
    STRATA_ASSIGN_OR_RETURN(hardware, policies::ParseHardware(options.fit));
  }
  json all = json::array();
  std::string text = absl::StrFormat("figures: %s%s\n", figures.source.empty() ? "built in" : figures.source,
                                     figures.machine.empty() ? "" : absl::StrCat(" (", figures.machine, ")"));
  // --workers plans the spec as if it said so: checked as `train` would
  // check it, and written with the rest of a fit.
  std::vector<std::string> overrides = options.overrides;
  if (options.workers > 0) overrides.push_back(absl::StrCat("parallel.workers=", options.workers));
  for (const auto& path : options.specs) {
    STRATA_ASSIGN_OR_RETURN(auto yaml, ReadFileToString(path));
    STRATA_ASSIGN_OR_RETURN(auto applied, policies::ApplyOverrides(yaml, overrides, path));
    STRATA_ASSIGN_OR_RETURN(auto spec, policies::ParseJobSpec(applied, {}, path));
    STRATA_ASSIGN_OR_RETURN(auto models, policies::JobModels(spec));
    STRATA_ASSIGN_OR_RETURN(auto states, policies::PlanModelStates(spec));
    const int64_t workers = spec.parallel.workers;
    if (options.fit.empty()) hardware.cpu_device = spec.memory.on_cpu();
    json j{{"spec", path}, {"algorithm", policies::AlgorithmName(spec.algorithm)}, {"workers", workers}};
    for (const auto& m : states.models) {
      j["models"].push_back({{"role", m.role},
                             {"parameters", m.parameters},
                             {"trained_parameters", m.trained_parameters},
                             {"shares_base_of", m.shares_base_of},
                             {"trainable", m.trainable},
                             {"device_bytes", m.total(0)},
                             {"host_bytes", m.total(1)},
                             {"nvme_bytes", m.total(2)}});
    }
    text += absl::StrFormat("\n%s (%s, %d worker%s)\n", path, policies::AlgorithmName(spec.algorithm), workers,
                            workers == 1 ? "" : "s");
    text += absl::StrFormat("  %-10s %14s %14s %12s %12s %12s   (model states)\n", "model", "parameters", "trained",
                            "device", "host", "nvme");
    for (const auto& m : states.models) {
      if (!m.shares_base_of.empty()) {
        text += absl::StrFormat("  %-10s the %s's frozen base (LoRA): no bytes of its own\n", m.role, m.shares_base_of);
        continue;
      }
      text += absl::StrFormat("  %-10s %14d %14d %12s %12s %12s\n", m.role, m.parameters, m.trained_parameters,
                              GiB(m.total(0)), GiB(m.total(1)), GiB(m.total(2)));
    }
    if (options.fit.empty()) {
      const JobPrediction p = policies::PredictJob(spec, models, figures, workers);
      j.update(PredictionJson(p));
      text += "  as the spec places it:\n" + PredictionText(p);
      all.push_back(j);
      continue;
    }
    const policies::FitResult fit = policies::FitJob(spec, models, figures, hardware, workers,
                                                     !options.fixed_micro_batch, !options.fixed_activations);
    j["fits"] = fit.fits;
    j["tried"] = fit.tried;
    if (!fit.fits) j["binding_tier"] = fit.binding_tier;
    j.update(PredictionJson(fit.chosen));
    j["candidates"] = json::array();
    for (const auto& c : fit.candidates) j["candidates"].push_back(PredictionJson(c));
    if (fit.fits) {
      text += absl::StrFormat("  fits %s: the fastest of %d placements that fit (%d tried):\n", options.fit,
                              fit.candidates.size() + 1, fit.tried);
      for (const auto& [role, rank] : fit.chosen.galore_rank) {
        text += absl::StrFormat("  only with GaLore: nothing fits with full Adam; models.%s.galore={rank: %d}\n", role,
                                rank);
      }
    } else {
      text += absl::StrFormat("  does NOT fit %s: no placement of the %d tried; %s binds. The nearest miss:\n",
                              options.fit, fit.tried, fit.binding_tier);
      for (const auto& [role, rank] : fit.chosen.galore_rank) {
        text += absl::StrFormat("  (with GaLore the fit tried: models.%s.galore={rank: %d})\n", role, rank);
      }
    }
    text += PredictionText(fit.chosen);
    for (size_t i = 0; i < fit.candidates.size() && i < 3; ++i) {
      const auto& c = fit.candidates[i];
      text += absl::StrFormat("  next: %.2f s, device %s, RSS %s, nvme %s: %s\n", c.iteration_s, GiB(c.peak[0]),
                              GiB(c.process_rss_bytes), GiB(c.peak[2]), PlacementLine(c));
    }
    if (!options.write.empty()) {
      if (!fit.fits) {
        return absl::ResourceExhaustedError(absl::StrCat(path, ": nothing fits ", options.fit, " (", fit.binding_tier,
                                                         " binds); ", options.write, " not written"));
      }
      std::vector<std::string> chosen = overrides;
      for (auto& o : policies::PredictionOverrides(fit.chosen)) chosen.push_back(std::move(o));
      STRATA_ASSIGN_OR_RETURN(auto chosen_yaml, policies::ApplyOverrides(yaml, chosen, path));
      STRATA_RETURN_IF_ERROR(WriteFileAtomically(options.write, chosen_yaml));
      text += absl::StrFormat("  wrote %s\n", options.write);
    }
    all.push_back(j);
  }
  if (options.json) return all.dump() + "\n";
  return text;
}

}  // namespace strata::services
