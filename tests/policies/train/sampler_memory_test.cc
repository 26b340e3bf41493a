// The device sampler's working memory, measured with the CPU device's
// allocation counter (offload/device, hence this directory).
#include <ATen/ATen.h>

#include "gtest/gtest.h"
#include "offload/device/device_memory.h"
#include "policies/model/sampler.h"

namespace strata::policies {
namespace {

// Bytes PickOnDevice allocates at most, per entry of the logits.
double PeakBytesPerEntry(int64_t rows, int64_t vocab, const SamplingOptions& options) {
  at::Generator gen = at::detail::createCPUGenerator(3);
  const at::Tensor logits = at::randn({rows, vocab}, gen, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor keys = at::randint(1 << 30, {rows, 2}, gen, at::TensorOptions().dtype(at::kLong));
  const at::Tensor greedy = at::arange(rows, at::kLong).remainder(4).eq(0);  // a greedy row in four
  offload::DeviceMemoryMonitor& monitor = offload::DeviceMemoryMonitor::Install();
  monitor.ResetPeak();
  const size_t before = monitor.current_bytes();
  { const at::Tensor picks = PickOnDevice(logits, options, keys, greedy); }
  return static_cast<double>(monitor.peak_bytes() - before) / static_cast<double>(rows * vocab);
}

// The race's Philox words (int64 tensors, ~76 bytes an entry when the
// whole vocabulary draws at once) are made a chunk of the vocabulary at a
// time, so a decode step of 64 rows over a 128k vocabulary (what a CUDA
// graph's memory pool keeps for the rollout) needs the logits' own size a
// few times over, not 76 bytes an entry: the probabilities (4), the
// log-sum-exp's temporary (4), a 64 MiB chunk (8 at this size), and for
// top-p the sort's values, indices and cumulative sum (16).
TEST(SamplerMemoryTest, TheRaceDrawsAChunkOfTheVocabularyAtATime) {
  SamplingOptions raw, truncated;
  truncated.temperature = 0.9;
  truncated.top_p = 0.95;
  const double raw_bytes = PeakBytesPerEntry(64, 128256, raw);
  const double truncated_bytes = PeakBytesPerEntry(64, 128256, truncated);
  EXPECT_LT(raw_bytes, 24.0);
  EXPECT_LT(truncated_bytes, 40.0);
  ::testing::Test::RecordProperty("raw_bytes_per_entry", std::to_string(raw_bytes));
  ::testing::Test::RecordProperty("top_p_bytes_per_entry", std::to_string(truncated_bytes));
}

}  // namespace
}  // namespace strata::policies
