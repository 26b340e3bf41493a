// The job spec with overrides, as SubmitJob receives them: YAML text, then
// after "\n----\n" one override per line.
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "fuzz/fuzz_util.h"
#include "policies/job/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto [yaml, rest] = strata::fuzz::SplitOnce(in);
  std::vector<std::string> overrides;
  if (!rest.empty()) overrides = absl::StrSplit(std::string(rest), '\n', absl::SkipEmpty());
  auto applied = strata::policies::ApplyOverrides(std::string(yaml), overrides, "fuzz");
  auto spec = strata::policies::ParseJobSpec(std::string(yaml), overrides, "fuzz");
  if (spec.ok()) {
    // What the coordinator stores must parse back to an accepted spec.
    strata::fuzz::Check(applied.ok(), "a spec that parses must re-emit");
    strata::fuzz::Check(strata::policies::ParseJobSpec(*applied, {}, "fuzz").ok(), "re-emitted spec parses");
    (void)strata::policies::RowsPerIteration(*spec);
    (void)strata::policies::CheckPathsWithin(*spec, "/srv", {"/srv/data"});
  }
  return 0;
}
