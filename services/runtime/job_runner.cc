#include "services/runtime/job_runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/rl/rl_algorithms.h"
#include "rewards/rule_rewards.h"

namespace strata::services {
namespace {

using nlohmann::json;
using policies::Algorithm;

constexpr int64_t kEvalSamplesPerPrompt = 4;

// The examples of a JSONL file, each checked for the fields it needs.
absl::StatusOr<std::vector<json>> ReadJsonl(const std::string& path, const std::vector<std::string>& fields) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
  std::vector<json> rows;
  size_t start = 0;
  for (int line = 1; start < text.size(); ++line) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string row = text.substr(start, end - start);
    start = end + 1;
    if (row.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(row, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": not a JSON object"));
    }
    for (const auto& f : fields) {
      if (!j.contains(f) || !j[f].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": field '", f, "' (a string) is missing"));
      }
    }
    rows.push_back(std::move(j));
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  return rows;
}

class Encoder {
 public:
  Encoder(const policies::Tokenizer& tokenizer, const policies::JobSpec& spec, int64_t eos)
      : tokenizer_(tokenizer), spec_(spec), eos_(eos) {}
  std::vector<int32_t> Prompt(const std::string& text) const {
    std::vector<int32_t> ids = tokenizer_.EncodeForPrompt(text);
    // Keep the end of an over-long prompt: it is what the response follows.
    const size_t max = static_cast<size_t>(spec_.data.max_prompt_tokens);
    if (ids.size() > max) ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(max));
    return ids;
  }
  std::vector<int32_t> Response(const std::string& text) const {
    std::vector<int32_t> ids = tokenizer_.Encode(text);
    const size_t max = static_cast<size_t>(spec_.data.max_response_tokens);
    if (ids.size() + 1 > max) ids.resize(max - 1);
    if (eos_ >= 0) ids.push_back(static_cast<int32_t>(eos_));
    return ids;
  }

 private:
  const policies::Tokenizer& tokenizer_;
  const policies::JobSpec& spec_;
  const int64_t eos_;
};

// Example indices of iteration `it`: epochs are reshuffled with the job
// seed, so batch contents depend only on (seed, iteration) and a resumed
// run sees the data an uninterrupted one would.
std::vector<size_t> BatchIndices(size_t examples, int64_t batch, int64_t it, uint64_t seed) {
  std::vector<size_t> out;
  std::vector<size_t> order;
  size_t order_epoch = SIZE_MAX;  // the epoch `order` was shuffled for
  const size_t first = static_cast<size_t>(it * batch);
  for (size_t k = first; k < first + static_cast<size_t>(batch); ++k) {
    const size_t epoch = k / examples;
    if (epoch != order_epoch) {  // a batch spans at most a few epochs
      order.resize(examples);
      std::iota(order.begin(), order.end(), 0);
      std::mt19937_64 rng(seed * 1315423911ULL + epoch);
      std::shuffle(order.begin(), order.end(), rng);
      order_epoch = epoch;
    }
    out.push_back(order[k % examples]);
  }
  return out;
}

std::string CheckpointName(int64_t iteration) { return absl::StrFormat("iter-%06d", iteration); }

// Writes a metrics line and flushes it to disk before the iteration counts as done.
absl::Status AppendLine(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  out << line << '\n';
  out.flush();
  if (!out) return absl::ResourceExhaustedError(absl::StrCat("cannot append to metrics file ", path));
  return absl::OkStatus();
}

// True when both paths name the same existing file or directory.
bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec) && !ec;
}

// Keeps the first `lines` lines of the metrics file (a resumed run rewrites
// what came after its checkpoint).
absl::Status TruncateLines(const std::string& path, int64_t lines) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status().code() == absl::StatusCode::kNotFound ? absl::OkStatus() : text.status();
  size_t pos = 0;
  for (int64_t i = 0; i < lines && pos < text->size(); ++i) {
    const size_t nl = text->find('\n', pos);
    pos = nl == std::string::npos ? text->size() : nl + 1;
  }
  return WriteFileAtomically(path, text->substr(0, pos));
}

void Progress(const JobRunOptions& o, int64_t it, int64_t total, const json& m) {
  if (o.progress == nullptr) return;
  auto get = [&](const char* key) { return m.contains(key) ? m[key].get<double>() : NAN; };
  std::string detail;
  for (auto [label, key] : {std::pair{"reward", "objective/scores"}, std::pair{"kl", "objective/kl"},
                            std::pair{"loss", "loss/train_avg"}, std::pair{"acc", "eval/pairwise_accuracy"},
                            std::pair{"eval", "eval/score"}}) {
    const double v = get(key);
    if (!std::isnan(v)) detail += absl::StrFormat(" %s %.3f", label, v);
  }
  const double seconds = get("time/iteration_s");
  if (o.progress_bar) {
    const int width = 24;
    const int filled = static_cast<int>(width * (it + 1) / std::max<int64_t>(total, 1));
    // \033[K clears what a longer previous line left behind.
    std::fprintf(o.progress, "\r\033[K[%s%s] %lld/%lld%s %.2f s/it",
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(), static_cast<long long>(it + 1),
                 static_cast<long long>(total), detail.c_str(), seconds);
    if (it + 1 == total) std::fprintf(o.progress, "\n");
  } else {
    std::fprintf(o.progress, "iteration %lld/%lld%s %.2f s/it\n", static_cast<long long>(it + 1),
                 static_cast<long long>(total), detail.c_str(), seconds);
  }
  std::fflush(o.progress);
}

}  // namespace

std::pair<std::string, int64_t> LatestCheckpoint(const std::string& dir) {
  std::pair<std::string, int64_t> best{"", -1};
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return best;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("iter-", 0) != 0 || name.find('.') != std::string::npos) continue;
    // state.json is written last: without it the checkpoint is incomplete.
    if (!IsRegularFile(JoinPath(entry.path().string(), "state.json"))) continue;
    const int64_t it = std::atoll(name.c_str() + 5);
    if (it > best.second) best = {entry.path().string(), it};
  }
  return best;
}

absl::Status RunJob(const policies::JobSpec& spec, policies::WorkerGroup& workers, const policies::Tokenizer& tokenizer,
                    const JobRunOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(spec.output_dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("output.dir: cannot create ", spec.output_dir, ": ", ec.message()));
  const std::string metrics_path =
      options.metrics_path.empty() ? JoinPath(spec.output_dir, "metrics.jsonl") : options.metrics_path;
  const Encoder encode(tokenizer, spec, tokenizer.eos_id());

  // Data.
  std::vector<policies::TextPair> sft;
  std::vector<policies::PreferencePair> pairs, eval_pairs;
  std::vector<std::vector<int32_t>> prompts, eval_prompts;
  std::vector<std::string> eval_prompt_text;
  const bool rl = spec.algorithm != Algorithm::kSft && spec.algorithm != Algorithm::kRewardModel;
  auto read_pairs = [&](const std::string& path, std::vector<policies::PreferencePair>* out) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(auto rows, ReadJsonl(path, {"prompt", "chosen", "rejected"}));
    for (const auto& r : rows) {
      out->push_back({encode.Prompt(r["prompt"]), encode.Response(r["chosen"]), encode.Response(r["rejected"])});
    }
    return absl::OkStatus();
  };
  if (spec.algorithm == Algorithm::kSft) {
    STRATA_ASSIGN_OR_RETURN(auto rows, ReadJsonl(spec.data.train, {"prompt", "response"}));
    for (const auto& r : rows) sft.push_back({encode.Prompt(r["prompt"]), encode.Response(r["response"])});
  } else if (spec.algorithm == Algorithm::kRewardModel) {
    STRATA_RETURN_IF_ERROR(read_pairs(spec.data.train, &pairs));
    if (!spec.data.eval.empty()) {
      STRATA_RETURN_IF_ERROR(read_pairs(spec.data.eval, &eval_pairs));
    }
  } else {
    STRATA_ASSIGN_OR_RETURN(auto rows, ReadJsonl(spec.data.train, {"prompt"}));
    for (const auto& r : rows) prompts.push_back(encode.Prompt(r["prompt"]));
    if (!spec.data.eval.empty()) {
      STRATA_ASSIGN_OR_RETURN(auto eval_rows, ReadJsonl(spec.data.eval, {"prompt"}));
      for (size_t i = 0; i < eval_rows.size() && static_cast<int64_t>(i) < spec.eval.prompts; ++i) {
        eval_prompt_text.push_back(eval_rows[i]["prompt"]);
        eval_prompts.push_back(encode.Prompt(eval_prompt_text.back()));
      }
    }
  }
  const size_t examples = spec.algorithm == Algorithm::kSft ? sft.size()
                          : spec.algorithm == Algorithm::kRewardModel ? pairs.size()
                                                                      : prompts.size();

  std::unique_ptr<policies::RlAlgorithm> algorithm;
  if (rl) {
    STRATA_ASSIGN_OR_RETURN(algorithm, policies::RlAlgorithm::Create(spec));
  }
  // RL evaluation: greedy responses to the eval prompts scored by the rule.
  rewards::RuleFn eval_rule;
  const std::string rule_name = !spec.eval.rule.empty() ? spec.eval.rule : spec.reward.rule;
  if (rl && spec.eval.every > 0 && !eval_prompts.empty()) {
    if (rule_name.empty()) return absl::InvalidArgumentError("eval.rule is required to evaluate this job");
    auto rule = rewards::MakeRule(rule_name);
    if (!rule.ok()) return absl::InvalidArgumentError(absl::StrCat("eval.rule: ", rule.status().message()));
    eval_rule = *rule;
  }
  auto evaluate = [&](json& line) -> absl::Status {
    if (spec.algorithm == Algorithm::kRewardModel && !eval_pairs.empty()) {
      STRATA_ASSIGN_OR_RETURN(auto stats, workers.EvaluateRewardModel(eval_pairs));
      line["eval/pairwise_accuracy"] = stats.accuracy;
      line["eval/loss"] = stats.loss;
    } else if (eval_rule) {
      // The policy is evaluated as it acts: sampled with the job's generation
      // settings (a greedy decode can sit at the rule's maximum while the
      // policy does not), with one fixed seed so evaluations compare.
      policies::RolloutRequest request;
      request.prompts = eval_prompts;
      request.samples_per_prompt = kEvalSamplesPerPrompt;
      request.sampling.temperature = spec.generation.temperature;
      request.sampling.top_p = spec.generation.top_p;
      request.sampling.top_k = spec.generation.top_k;
      request.sampling.max_new_tokens = spec.generation.max_new_tokens;
      request.sampling.seed = policies::IterationSeed(spec.train.seed, -1);
      STRATA_ASSIGN_OR_RETURN(auto rollouts, workers.Generate(request));
      double total = 0;
      for (const auto& r : rollouts) {
        total += eval_rule(eval_prompt_text[static_cast<size_t>(r.prompt_index)], tokenizer.Decode(r.response));
      }
      line["eval/score"] = total / static_cast<double>(rollouts.size());
    }
    return absl::OkStatus();
  };

  // Resume.
  int64_t start = 0;
  if (options.resume) {
    auto [dir, iteration] = LatestCheckpoint(spec.checkpoint.dir);
    if (!dir.empty()) {
      STRATA_ASSIGN_OR_RETURN(auto state_text, ReadFileToString(JoinPath(dir, "state.json")));
      json state = json::parse(state_text, nullptr, false);
      if (state.is_discarded() || !state.contains("metrics_lines")) {
        return absl::DataLossError(absl::StrCat(dir, "/state.json is corrupt"));
      }
      if (state.contains("run_id") && !state["run_id"].is_string()) {
        return absl::DataLossError(absl::StrCat(dir, "/state.json: run_id is not a string"));
      }
      const std::string owner = state.value("run_id", std::string());
      const bool known_own = owner.empty() && !options.own_checkpoint.empty() && SameFile(dir, options.own_checkpoint);
      if (!options.run_id.empty() && owner != options.run_id && !known_own) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint.dir ", spec.checkpoint.dir, " holds checkpoints of ",
            owner.empty() ? std::string("an earlier run") : absl::StrCat("job ", owner), " (newest: ", dir,
            "); give job ", options.run_id, " its own output.dir, or remove that run's outputs"));
      }
      STRATA_RETURN_IF_ERROR(workers.LoadCheckpoint(dir));
      if (algorithm && state.contains("algorithm")) {
        algorithm->Restore(state["algorithm"].get<std::map<std::string, double>>());
      }
      STRATA_RETURN_IF_ERROR(TruncateLines(metrics_path, state["metrics_lines"].get<int64_t>()));
      start = iteration;
      if (options.progress) std::fprintf(options.progress, "resuming from %s (iteration %lld)\n", dir.c_str(),
                                         static_cast<long long>(iteration));
    }
  }
  if (start == 0) {
    STRATA_RETURN_IF_ERROR(WriteFileAtomically(metrics_path, ""));
  }
  int64_t metrics_lines = start;

  for (int64_t it = start; it < spec.train.iterations; ++it) {
    if (options.cancelled && options.cancelled()) return absl::CancelledError("job cancelled");
    json line;
    line["iteration"] = it;
    // The first line carries the starting policy's evaluation.
    if (it == 0 && (eval_rule || !eval_pairs.empty())) {
      STRATA_RETURN_IF_ERROR(evaluate(line));
      for (auto& [k, v] : line.items()) {
        if (k.rfind("eval/", 0) == 0) line["eval/initial_" + k.substr(5)] = v;
      }
    }
    const auto idx = BatchIndices(examples, spec.train.batch_size, it, spec.train.seed);
    const auto started = std::chrono::steady_clock::now();
    if (rl) {
      std::vector<std::vector<int32_t>> batch;
      for (size_t i : idx) batch.push_back(prompts[i]);
      STRATA_ASSIGN_OR_RETURN(auto metrics, algorithm->Iterate(workers, batch, it));
      for (const auto& [k, v] : metrics) line[k] = v;
    } else {
      workers.BeginPhase("update");
      absl::StatusOr<policies::TrainStats> stats;
      if (spec.algorithm == Algorithm::kSft) {
        std::vector<policies::TextPair> batch;
        for (size_t i : idx) batch.push_back(sft[i]);
        stats = workers.TrainSft(batch);
      } else {
        std::vector<policies::PreferencePair> batch;
        for (size_t i : idx) batch.push_back(pairs[i]);
        stats = workers.TrainRewardModel(batch);
        if (stats.ok()) line["train/pairwise_accuracy"] = stats->accuracy;
      }
      if (!stats.ok()) return stats.status();
      line["loss/train_avg"] = stats->loss;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      line["time/iteration_s"] = seconds;
      line["time/update_s"] = seconds;
      for (const auto& [tier, bytes] : workers.PhaseMemory("update").peak_bytes) {
        line["memory/" + tier + "_peak_bytes"] = bytes;
      }
    }
    const bool last = it + 1 == spec.train.iterations;
    if (spec.eval.every > 0 && ((it + 1) % spec.eval.every == 0 || last)) {
      STRATA_RETURN_IF_ERROR(evaluate(line));
    }
    STRATA_RETURN_IF_ERROR(AppendLine(metrics_path, line.dump()));
    ++metrics_lines;
    if (options.on_metrics) options.on_metrics(line);
    if ((it + 1) % spec.train.log_every == 0 || last) Progress(options, it, spec.train.iterations, line);

    if (spec.checkpoint.every > 0 && (it + 1) % spec.checkpoint.every == 0 && !last) {
      // Written under a temporary name and renamed, state.json last: a crash
      // mid-write leaves no directory that looks complete.
      const std::string final_dir = JoinPath(spec.checkpoint.dir, CheckpointName(it + 1));
      const std::string tmp_dir = final_dir + ".tmp";
      std::filesystem::remove_all(tmp_dir, ec);
      std::filesystem::create_directories(tmp_dir, ec);
      if (ec) return absl::PermissionDeniedError(absl::StrCat("checkpoint.dir: cannot create ", tmp_dir));
      STRATA_RETURN_IF_ERROR(workers.SaveCheckpoint(tmp_dir));
      json state{{"iteration", it + 1},
                 {"metrics_lines", metrics_lines},
                 {"run_id", options.run_id},
                 {"algorithm", algorithm ? algorithm->State() : policies::Metrics{}}};
      STRATA_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(tmp_dir, "state.json"), state.dump()));
      std::filesystem::remove_all(final_dir, ec);
      std::filesystem::rename(tmp_dir, final_dir, ec);
      if (ec) return absl::InternalError(absl::StrCat("checkpoint: rename ", tmp_dir, ": ", ec.message()));
      if (options.on_checkpoint) options.on_checkpoint(it + 1, final_dir);
    }
  }
  return workers.SaveOutput(spec.output_dir);
}

}  // namespace strata::services
