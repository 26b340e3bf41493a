#include "bench/tokenizer_bench.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "policies/tokenizer/tokenizer.h"

namespace strata::bench {
namespace {

using nlohmann::json;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

absl::StatusOr<std::string> RunTokenizerBench(const TokenizerBenchRequest& request) {
  if (request.repeat < 1 || request.loads < 1) {
    return absl::InvalidArgumentError("--repeat and --loads must be at least 1");
  }
  STRATA_ASSIGN_OR_RETURN(auto corpus_text, ReadFileToString(request.corpus));
  const json corpus = json::parse(corpus_text, nullptr, false);
  if (!corpus.is_array() || !std::all_of(corpus.begin(), corpus.end(), [](const json& j) { return j.is_string(); })) {
    return absl::InvalidArgumentError(absl::StrCat("--corpus ", request.corpus, ": not a JSON array of strings"));
  }

  // The peer first: its ids are what strata's must equal.
  const std::string script = JoinPath(request.reference, "encode.mjs");
  if (!IsRegularFile(script)) {
    return absl::NotFoundError(absl::StrCat("--reference: no ", script, " (run from the repository root)"));
  }
  STRATA_ASSIGN_OR_RETURN(auto peer, RunProcess({"node", script, request.tokenizer, request.corpus,
                                                 std::to_string(request.repeat)},
                                                std::filesystem::temp_directory_path().string()));
  if (peer.exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("the Hugging Face peer (node ", script, ") failed: ", peer.error));
  }
  const json hf = json::parse(peer.output, nullptr, false);
  if (!hf.is_object()) return absl::InternalError("the Hugging Face peer printed no JSON");

  double load_s = std::numeric_limits<double>::infinity();
  std::unique_ptr<policies::Tokenizer> tokenizer;
  for (int64_t i = 0; i < request.loads; ++i) {
    const auto start = std::chrono::steady_clock::now();
    STRATA_ASSIGN_OR_RETURN(tokenizer, policies::Tokenizer::Load(request.tokenizer));
    load_s = std::min(load_s, Seconds(start));
  }
  std::vector<std::string> lines;
  for (const json& line : corpus) lines.push_back(line.get<std::string>());
  int64_t mismatched = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    mismatched += tokenizer->Encode(lines[i]) != hf["lines"][i]["ids"].get<std::vector<int32_t>>();
  }
  int64_t tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < request.repeat; ++r) {
    for (const std::string& line : lines) tokens += static_cast<int64_t>(tokenizer->Encode(line).size());
  }
  const double encode_s = Seconds(start);
  const int64_t bytes = static_cast<int64_t>(std::filesystem::file_size(request.tokenizer));

  const double hf_load = hf["load_s"].get<double>(), hf_encode = hf["encode_s"].get<double>();
  const double hf_tokens = hf["tokens"].get<double>();
  if (request.json) {
    return json{{"tokenizer", request.tokenizer},
                {"file_bytes", bytes},
                {"lines", lines.size()},
                {"repeat", request.repeat},
                {"mismatched_lines", mismatched},
                {"strata", {{"load_s", load_s}, {"tokens", tokens}, {"tokens_per_s", tokens / encode_s}}},
                {"hf_tokenizers",
                 {{"load_s", hf_load}, {"tokens", hf_tokens}, {"tokens_per_s", hf_tokens / hf_encode}}}}
               .dump() +
           "\n";
  }
  return absl::StrFormat(
      "%s (%.1f MB, %d lines x %d)\n"
      "  %-16s %10s %14s\n"
      "  %-16s %9.3fs %14.0f\n"
      "  %-16s %9.3fs %14.0f\n"
      "  lines encoded differently from the peer: %d\n",
      request.tokenizer, bytes / 1e6, lines.size(), request.repeat, "", "load", "encode tok/s", "strata", load_s,
      tokens / encode_s, "hf tokenizers", hf_load, hf_tokens / hf_encode, mismatched);
}

}  // namespace strata::bench
