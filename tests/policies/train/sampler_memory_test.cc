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

// The race's Philox words (int64 tensors, 76 bytes an entry when the whole
// vocabulary draws at once) are made a chunk of the vocabulary at a time,
// at most kRaceChunkBytes of them. Beside the chunk a step needs the
// logits' own size a few times over: the probabilities (4), a log-sum-exp's
// temporary (4) and a little more (under 16 bytes an entry); for top-p
// also the sort's values, indices and cumulative sum (16 more). At 64 rows
// of a 128k vocabulary the whole race would take 76 bytes an entry, past
// both bounds.
TEST(SamplerMemoryTest, TheRaceDrawsAChunkOfTheVocabularyAtATime) {
  const int64_t rows = 64, vocab = 128256;
  const double chunk = static_cast<double>(kRaceChunkBytes) / static_cast<double>(rows * vocab);
  SamplingOptions raw, truncated;
  truncated.temperature = 0.9;
  truncated.top_p = 0.95;
  const double raw_bytes = PeakBytesPerEntry(rows, vocab, raw);
  const double truncated_bytes = PeakBytesPerEntry(rows, vocab, truncated);
  ASSERT_LT(16.0 + chunk, 76.0) << "the sizes no longer tell a chunked race from a whole one";
  EXPECT_LT(raw_bytes, 16.0 + chunk);
  EXPECT_LT(truncated_bytes, 32.0 + chunk);
  ::testing::Test::RecordProperty("raw_bytes_per_entry", std::to_string(raw_bytes));
  ::testing::Test::RecordProperty("top_p_bytes_per_entry", std::to_string(truncated_bytes));
}

}  // namespace
}  // namespace strata::policies
