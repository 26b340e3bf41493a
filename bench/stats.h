// Small statistics shared by the benches.
#ifndef STRATA_BENCH_STATS_H_
#define STRATA_BENCH_STATS_H_

#include <algorithm>
#include <vector>

namespace strata::bench {

// The median of `values`; 0 for none.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace strata::bench

#endif  // STRATA_BENCH_STATS_H_
