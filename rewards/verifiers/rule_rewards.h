// Rule-based rewards: a score computed from the response text alone, for
// verifiable tasks, tests, and evaluating the demo task with its hidden
// rule. Every rule returns a score in [0, 1], 1 being the rule's maximum.
#ifndef STRATA_REWARDS_VERIFIERS_RULE_REWARDS_H_
#define STRATA_REWARDS_VERIFIERS_RULE_REWARDS_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace strata::rewards {

using RuleFn = std::function<double(const std::string& prompt, const std::string& response)>;

// Known rules:
//   vowel_fraction  fraction of the response's letters that are a, e, i, o, u
//                   (0 for a response without letters): the tiny task's rule
//   length_ratio    min(1, response characters / 32)
//   contains:WORD   1 if WORD occurs in the response, else 0
// INVALID_ARGUMENT naming the rule otherwise.
absl::StatusOr<RuleFn> MakeRule(const std::string& name);

}  // namespace strata::rewards

#endif  // STRATA_REWARDS_VERIFIERS_RULE_REWARDS_H_
