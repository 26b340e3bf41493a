// The hyperparameters of a Llama-family decoder, read from and written to a
// Hugging Face `config.json`. No torch here, so the planner and the services
// can reason about model shapes without linking libtorch.
#ifndef STRATA_POLICIES_CONFIG_LLAMA_CONFIG_H_
#define STRATA_POLICIES_CONFIG_LLAMA_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::policies {

// `rope_scaling` from config.json. kNone leaves the frequencies as they are.
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;                              // linear and llama3
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

// The decoder families strata runs, by `model_type` in config.json. They
// share the Llama block and differ in a few places:
//   mistral  a sliding attention window (`sliding_window`)
//   qwen2    biases on the q, k and v projections (Qwen2, Qwen2.5)
//   qwen3    RMSNorm over each head of q and k before RoPE (`q_norm`,
//            `k_norm`), and a `head_dim` independent of hidden / heads
enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3 };

// "llama", "mistral", "qwen2", "qwen3".
const char* ModelTypeName(ModelFamily family);

struct LlamaConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  // Grouped-query attention: heads share key/value projections in groups of
  // num_attention_heads / num_key_value_heads. Defaults to num_attention_heads.
  int64_t num_key_value_heads = 32;
  // Per-head width; config.json may set it, otherwise hidden / heads.
  int64_t head_dim = 128;
  // Biases on the q, k and v projections (qwen2).
  bool qkv_bias = false;
  // RMSNorm over each query and key head, before RoPE (qwen3).
  bool qk_norm = false;
  // Each query attends to at most this many keys, itself included (mistral);
  // 0: every earlier key.
  int64_t sliding_window = 0;
  int64_t max_position_embeddings = 4096;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  RopeScaling rope_scaling;
  int64_t bos_token_id = 1;                  // -1 when absent
  std::vector<int64_t> eos_token_ids = {2};  // config may give one id or a list
  int64_t pad_token_id = -1;                 // -1 when absent
  // The id padding positions hold (always masked out): 0 without one.
  int64_t PadId() const { return pad_token_id >= 0 ? pad_token_id : 0; }
  // Outputs of the scalar head (LlamaForSequenceClassification); 1 for reward/critic.
  int64_t num_labels = 1;
  // "float32", "bfloat16", "float16" as written by HF; informational.
  std::string torch_dtype = "float32";

  // Checks every field; the message names the offending key.
  absl::Status Validate() const;

  // Parses config.json text. `source` names the file in error messages.
  static absl::StatusOr<LlamaConfig> FromJson(const std::string& text, const std::string& source);
  // Reads DIR/config.json.
  static absl::StatusOr<LlamaConfig> Load(const std::string& model_dir);

  // The family's HF class: "Qwen2ForCausalLM", "MistralForSequenceClassification", ...
  std::string ArchitectureName(bool scalar_head) const;
  // HF config.json text in the family's own layout, so that `transformers`
  // loads it as that family.
  std::string ToJson(bool scalar_head) const;

  // Parameters of one decoder layer (projections, their biases, norms).
  int64_t LayerParameters() const;
  // Parameter count of the decoder stack with embeddings and, unless tied,
  // the LM head.
  int64_t NumParameters() const;
  // Elements of each tensor the layer-wise trainer trains, in the order it
  // meets them (and ZeRO deals them out): the embedding, the final norm,
  // the untied LM head or the scalar head, then every layer's tensors in
  // LlamaLayerWeights::Named() order.
  std::vector<int64_t> TrainedTensorElements(bool scalar_head) const;
};

// generation_config.json's eos_token_id (a number or a list) in `model_dir`:
// the end-of-turn ids an instruct model stops at beside config.json's. Empty
// when the file is absent or does not say; INVALID_ARGUMENT naming the file
// for malformed JSON or a field of the wrong type.
absl::StatusOr<std::vector<int64_t>> ReadGenerationEosIds(const std::string& model_dir);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CONFIG_LLAMA_CONFIG_H_
