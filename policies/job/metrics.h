// A phase's or an iteration's scalar results, by name ("objective/kl",
// "time/rollout_s", ...), as every room reports them.
#ifndef STRATA_POLICIES_JOB_METRICS_H_
#define STRATA_POLICIES_JOB_METRICS_H_

#include <map>
#include <string>

namespace strata::policies {

using Metrics = std::map<std::string, double>;

}  // namespace strata::policies

#endif  // STRATA_POLICIES_JOB_METRICS_H_
