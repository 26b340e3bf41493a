// `strata bench generate`: greedy decoding throughput of a randomly
// initialised Llama shape, with the KV cache against full recomputation
// (the peer) in the same run, on the same weights and prompts.
#ifndef STRATA_BENCH_GENERATE_BENCH_H_
#define STRATA_BENCH_GENERATE_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct GenerateBenchRequest {
  int64_t layers = 4;
  int64_t hidden = 256;
  int64_t heads = 8;
  int64_t kv_heads = 4;
  int64_t intermediate = 688;
  int64_t vocab = 512;
  int64_t batch = 1;
  int64_t prompt_tokens = 32;
  int64_t new_tokens = 64;
  int64_t repeats = 3;  // best of N for each path
  std::string dtype = "fp32";
  bool json = false;
};

absl::StatusOr<std::string> RunGenerateBench(const GenerateBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_GENERATE_BENCH_H_
