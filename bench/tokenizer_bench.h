// `strata bench tokenizer`: load time and encode throughput of strata's
// tokenizer on a tokenizer.json, against Hugging Face's `tokenizers` (the
// npm package, its Rust core) on the same file and corpus in the same run.
// The peer runs as `node <reference>/encode.mjs`, which also gives the ids
// every line must encode to: a mismatch is reported, not hidden.
#ifndef STRATA_BENCH_TOKENIZER_BENCH_H_
#define STRATA_BENCH_TOKENIZER_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct TokenizerBenchRequest {
  std::string tokenizer;  // a tokenizer.json
  std::string corpus;     // a JSON array of strings
  // The directory of encode.mjs (with its node_modules).
  std::string reference = "tests/policies/tokenizer/reference";
  int64_t repeat = 50;  // the corpus is encoded this many times over
  int64_t loads = 3;    // best of N loads
  bool json = false;
};

absl::StatusOr<std::string> RunTokenizerBench(const TokenizerBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_TOKENIZER_BENCH_H_
