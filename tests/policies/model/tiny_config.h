// The tiny decoder the model and rollout tests build with random weights:
// 2 layers, hidden 32, grouped-query attention (4 heads over 2), a 50-token
// vocabulary, in each family's layout.
#ifndef STRATA_TESTS_POLICIES_MODEL_TINY_CONFIG_H_
#define STRATA_TESTS_POLICIES_MODEL_TINY_CONFIG_H_

#include "policies/config/llama_config.h"

namespace strata::policies {

// Mistral with a 5-token window (shorter than most test sequences), Qwen2
// with q/k/v biases and tied embeddings, Qwen3 with q/k norms and a head_dim
// apart from hidden / heads.
inline LlamaConfig TinyConfig(ModelFamily family = ModelFamily::kLlama) {
  LlamaConfig c;
  c.family = family;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  switch (family) {
    case ModelFamily::kMistral:
      c.sliding_window = 5;
      break;
    case ModelFamily::kQwen2:
      c.qkv_bias = true;
      c.tie_word_embeddings = true;
      break;
    case ModelFamily::kQwen3:
      c.qk_norm = true;
      c.head_dim = 12;
      break;
    default:
      break;
  }
  return c;
}

}  // namespace strata::policies

#endif  // STRATA_TESTS_POLICIES_MODEL_TINY_CONFIG_H_
