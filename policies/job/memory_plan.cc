#include "policies/job/memory_plan.h"

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"

namespace strata::policies {
namespace {

int T(offload::Tier t) { return static_cast<int>(t); }

int64_t LayerParams(const LlamaConfig& c) { return c.LayerParameters(); }

absl::StatusOr<LlamaConfig> ConfigOf(const ModelSpec& model, const std::string& role) {
  const std::string path = !model.path.empty() ? JoinPath(model.path, "config.json") : model.init;
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("models.", role, ": ", text.status().message()));
  }
  return LlamaConfig::FromJson(*text, path);
}

}  // namespace

ModelFootprint PlanModel(const std::string& role, const LlamaConfig& config, const ModelSpec& model, bool trainable,
                         bool scalar_head) {
  ModelFootprint f;
  f.role = role;
  f.trainable = trainable;
  const int64_t layers = LayerParams(config) * config.num_hidden_layers;
  const int64_t embed = config.vocab_size * config.hidden_size;
  const int64_t head = scalar_head ? config.num_labels * config.hidden_size
                                   : (config.tie_word_embeddings ? 0 : config.vocab_size * config.hidden_size);
  const int64_t resident = embed + head + config.hidden_size;
  f.parameters = layers + resident;
  const int64_t bytes = model.dtype == "bf16" ? 2 : 4;
  const auto& p = model.placement;
  f.weights[T(p.weights)] += layers * bytes;
  f.weights[T(offload::Tier::kDevice)] += resident * bytes;
  if (p.weights != offload::Tier::kDevice) {
    f.weights[T(offload::Tier::kDevice)] +=
        (p.prefetch_depth + 1) * LayerParams(config) * bytes;  // the streaming window
  }
  if (trainable) {
    f.gradients[T(p.gradients)] += f.parameters * 4;
    f.optimizer[T(p.optimizer)] += f.parameters * 12;
  }
  return f;
}

absl::StatusOr<MemoryPlan> PlanModelStates(const JobSpec& spec) {
  MemoryPlan plan;
  auto add = [&](const std::string& role, ModelSpec model, bool trainable, bool scalar,
                 const std::string& fallback_path) -> absl::Status {
    if (model.path.empty() && model.init.empty()) model.path = fallback_path;
    STRATA_ASSIGN_OR_RETURN(auto config, ConfigOf(model, role));
    plan.models.push_back(PlanModel(role, config, model, trainable, scalar));
    return absl::OkStatus();
  };
  absl::Status s;
  switch (spec.algorithm) {
    case Algorithm::kSft:
      s = add("actor", spec.actor, true, false, "");
      break;
    case Algorithm::kRewardModel:
      s = add("reward", spec.reward, true, true, "");
      break;
    default:
      s = add("actor", spec.actor, true, false, "");
      if (s.ok()) s = add("reference", spec.reference, false, false, spec.actor.path);
      if (s.ok() && spec.reward.rule.empty()) s = add("reward", spec.reward, false, true, "");
      if (s.ok() && spec.algorithm == Algorithm::kPpo) s = add("critic", spec.critic, true, true, spec.reward.path);
  }
  if (!s.ok()) return s;
  for (const auto& m : plan.models) {
    for (int t = 0; t < 3; ++t) plan.total[static_cast<size_t>(t)] += m.total(t);
  }
  return plan;
}

}  // namespace strata::policies
