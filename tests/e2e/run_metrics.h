// A run's metrics.jsonl, and the comparison of two runs that computed the
// same training with their float sums taken in another order: another gang
// size, a resume on another gang, micro-batches, or another CPU's kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/driver/job_runner.h"

namespace strata::testing {

// The metrics lines of a run without the rank's own measurements (wall
// clock, memory), which vary run to run.
inline std::vector<nlohmann::json> RunMetrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    for (auto it = j.begin(); it != j.end();) {
      it = services::IsRankMeasurement(it.key()) ? j.erase(it) : std::next(it);
    }
    lines.push_back(j);
  }
  return lines;
}

// What a count-like metric counts in one iteration: PPO's clip fractions
// average, over `ppo_epochs` passes, the share of the batch's response
// tokens where a clip is active.
struct CountedTokens {
  int sequences = 0;   // responses per iteration, the whole gang's
  int ppo_epochs = 1;  // passes over them per update
};

// Continuous metrics of the starting weights: a float32 sum in another
// order differs by a few ulps, ~1e-6 of a token's log-prob (|log p| up to
// ~10), so up to ~1e-4 in a sequence's sum of log-prob differences over <= 8
// tokens, ~1e-7 relative elsewhere (measured: 4e-7, 3.4e-5 for objective/kl
// over the service).
inline double StartingWeightsTolerance(double value) { return 1e-4 + 1e-4 * std::abs(value); }

// After an optimizer step the runs' weights differ by more than rounding:
// Adam's step is about lr x the sign of each gradient element, so where an
// element's gradient is float noise (terms that cancel) the two runs step up
// to lr apart (tests/e2e/train_test.cc bounds the weights). A smooth metric
// averages over every tensor, so it differs by a smaller share of its value
// than the worst tensor does (measured on an AMD EPYC with AVX2, weights up
// to 2% apart: objective/kl 0.3% at iteration 1, the gradient norm 0.02%);
// the bound is 2%.
inline double SteppedWeightsTolerance(double value) { return 1e-4 + 2e-2 * std::abs(value); }

// Whether metric `key` of iteration `iteration` was computed after an
// optimizer step: every metric of a later iteration, and PPO's update
// losses, averaged over minibatches of which all but the first follow one.
inline bool AfterAStep(size_t iteration, const std::string& key) {
  return iteration > 0 || key == "loss/policy_avg" || key == "loss/value_avg" || key == "policy/approxkl_avg";
}

// A clip fraction counts tokens, and a token near a clip boundary flips
// with noise. More flip than rounding alone explains: after a minibatch's
// step, Adam's first update (about lr x the sign of each gradient element)
// turns float noise in near-zero gradient elements into weight
// differences of up to lr, which move later minibatches' ratios and values
// by far more than an ulp. So the bound is one token's share of the metric,
// 1 / (epochs x response tokens), for a single near-tie, plus 5% of the
// tokens (measured on an AVX-512 CPU: 3 of 64 tokens, 4.7%; none on AVX2).
inline double ClipFractionTolerance(const CountedTokens& counted, double response_tokens_per_sequence) {
  const double tokens = counted.ppo_epochs * counted.sequences * response_tokens_per_sequence;
  return 1.0 / std::max(tokens, 1.0) + 0.05;
}

inline bool IsClipFraction(const std::string& key) { return key.find("clipfrac") != std::string::npos; }

// Every metric of `want` is in `got` and agrees within the tolerances above
// (`counted` gives a clip fraction's token count; `label` prefixes failures).
// `iterations`: how many leading iterations to compare (all: -1).
inline void ExpectSameMetrics(const std::vector<nlohmann::json>& want, const std::vector<nlohmann::json>& got,
                              const CountedTokens& counted, const std::string& label = "", int iterations = -1) {
  ASSERT_EQ(got.size(), want.size()) << label;
  const size_t compared = iterations < 0 ? want.size() : std::min(want.size(), static_cast<size_t>(iterations));
  for (size_t i = 0; i < compared; ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << label << " " << got[i].dump() << " vs " << want[i].dump();
    for (const auto& [key, value] : want[i].items()) {
      ASSERT_TRUE(got[i].contains(key)) << label << " iteration " << i << " lacks " << key;
      const double a = value.get<double>(), b = got[i][key].get<double>();
      double tolerance = AfterAStep(i, key) ? SteppedWeightsTolerance(a) : StartingWeightsTolerance(a);
      if (IsClipFraction(key)) {
        tolerance = ClipFractionTolerance(counted, want[i].value("objective/response_tokens", 1.0));
      }
      EXPECT_LE(std::abs(a - b), tolerance) << label << " iteration " << i << " " << key << ": " << a << " vs " << b;
    }
  }
}

}  // namespace strata::testing
