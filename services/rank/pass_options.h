// How a role's forward and backward passes run on one rank.
#ifndef STRATA_SERVICES_RANK_PASS_OPTIONS_H_
#define STRATA_SERVICES_RANK_PASS_OPTIONS_H_

#include <c10/core/Device.h>

#include <cstdint>

#include "policies/config/rollout_options.h"
#include "policies/dist/process_group.h"

namespace strata::services {

struct PassOptions {
  policies::ProcessGroup* gang = nullptr;  // sums gradients and figures; outlives the role
  at::Device device = at::kCPU;            // where the models compute (memory.device)
  int64_t micro_batch_size = 0;            // train.micro_batch_size: rows per pass, 0 = all
  policies::RolloutEngineOptions rollout;  // generation's engine keys, max_concurrency resolved
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_PASS_OPTIONS_H_
