// The working memory of a decoder layer's forward and backward, blocked
// attention against materialised, measured with the CPU device's allocation
// counter (offload/device, hence this directory, beside the trainer that
// recomputes layers this way).
#include <c10/core/GradMode.h>

#include "gtest/gtest.h"
#include "offload/device/device_memory.h"
#include "policies/model/llama.h"

namespace strata::policies {
namespace {

// The most bytes one layer's forward and backward over a row of `t` tokens
// allocates beyond its inputs.
size_t PeakBytes(int64_t t, AttentionKind kind) {
  LlamaConfig config;
  config.vocab_size = 16, config.hidden_size = 32, config.intermediate_size = 64, config.num_hidden_layers = 1;
  config.num_attention_heads = 4, config.num_key_value_heads = 2, config.head_dim = 8;
  config.max_position_embeddings = 4096;
  auto model = LlamaModel::RandomInit(config, LlamaHead::kLanguageModel, at::kFloat, 1, 0.2);
  const at::Tensor mask = at::ones({1, t}, at::kLong);
  const at::Tensor hidden = at::randn({1, t, config.hidden_size}).requires_grad_();
  offload::DeviceMemoryMonitor& monitor = offload::DeviceMemoryMonitor::Install();
  monitor.ResetPeak();
  const size_t before = monitor.current_bytes();
  {
    const LayerContext ctx = MakeLayerContext(config, mask, t, at::kFloat, kind);
    DecoderLayerForward(config, model->weights().layers[0], hidden, ctx, nullptr, 0).sum().backward();
  }
  return monitor.peak_bytes() - before;
}

// Quadrupling the sequence about quadruples the blocked layer's peak (a
// block pair's scores, and what is linear in T: activations, the fp32
// output, the log-sum-exp, the gradients) where the materialised
// attention's [T, S] scores grow it sixteenfold.
TEST(AttentionMemoryTest, BlockedWorkingMemoryGrowsLinearlyInTheSequence) {
  const double blocked = static_cast<double>(PeakBytes(2048, AttentionKind::kBlocked)) /
                         static_cast<double>(PeakBytes(512, AttentionKind::kBlocked));
  const double materialised = static_cast<double>(PeakBytes(2048, AttentionKind::kMaterialised)) /
                              static_cast<double>(PeakBytes(512, AttentionKind::kMaterialised));
  EXPECT_LT(blocked, 5.0);
  EXPECT_GT(materialised, 10.0);
  EXPECT_LT(PeakBytes(2048, AttentionKind::kBlocked) * 8, PeakBytes(2048, AttentionKind::kMaterialised));
}

}  // namespace
}  // namespace strata::policies
