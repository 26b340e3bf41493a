// A Llama-family decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention,
// KV cache) written with ATen ops so that each layer can be run on its own:
// the offload engine streams layers to the device and calls
// DecoderLayerForward one layer at a time.
//
// Shapes: B batch, T new tokens, S = cached + new tokens, H hidden,
// n_h query heads, n_kv key/value heads, d head_dim, V vocabulary.
#ifndef STRATA_POLICIES_MODEL_LLAMA_H_
#define STRATA_POLICIES_MODEL_LLAMA_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/config/attention_blocks.h"
#include "policies/config/llama_config.h"

namespace strata::policies {

// Weights of one decoder layer, HF layout ([out, in] for projections).
struct LlamaLayerWeights {
  at::Tensor input_layernorm;           // [H]
  at::Tensor q_proj, k_proj, v_proj;    // [n_h*d, H], [n_kv*d, H], [n_kv*d, H]
  at::Tensor q_bias, k_bias, v_bias;    // [n_h*d], [n_kv*d], [n_kv*d]; qwen2 only
  at::Tensor q_norm, k_norm;            // [d]; qwen3 only
  at::Tensor o_proj;                    // [H, n_h*d]
  at::Tensor post_attention_layernorm;  // [H]
  at::Tensor gate_proj, up_proj;        // [I, H]
  at::Tensor down_proj;                 // [H, I]

  // Which of the optional tensors this layer has (its family's layout).
  bool has_qkv_bias = false;
  bool has_qk_norm = false;
  // An empty layer with `config`'s layout.
  static LlamaLayerWeights Layout(const LlamaConfig& config);

  // Every tensor of the layout, with its HF name relative to
  // "model.layers.<i>.", in a fixed order (streaming and the optimizer index
  // tensors by it).
  std::vector<std::pair<std::string, at::Tensor*>> Named();
  // The inverse: the layer whose Named() is `names` with `tensors` in place.
  // INVALID_ARGUMENT naming the tensor for a name no layout has, or a set
  // that is not a whole layout.
  static absl::StatusOr<LlamaLayerWeights> FromNamed(const std::vector<std::string>& names,
                                                     std::vector<at::Tensor> tensors);
};

// Which output the model produces on top of the decoder.
enum class LlamaHead {
  kLanguageModel,  // LlamaForCausalLM: lm_head -> logits over the vocabulary
  kScalar,         // LlamaForSequenceClassification: score -> num_labels values
};

struct LlamaWeights {
  at::Tensor embed_tokens;  // [V, H]
  std::vector<LlamaLayerWeights> layers;
  at::Tensor norm;     // [H]
  at::Tensor lm_head;  // [V, H]; undefined when tied to embed_tokens
  at::Tensor score;    // [num_labels, H]; only for kScalar
};

// Moves the resident parts of `w` (embeddings, norm, heads) to `device`,
// and its layers too when `include_layers`.
void MoveToDevice(LlamaWeights& w, const at::Device& device, bool include_layers);

// Keys and values of the tokens already seen, for incremental decoding. A
// forward pass with a cache appends each layer's new keys and values and
// attends over what Append returns; the attention mask covers length()
// cached columns plus the new tokens.
class KvCache {
 public:
  virtual ~KvCache() = default;
  // Columns already cached (the mask's width before the new tokens).
  virtual int64_t length() const = 0;
  // Stores k, v ([B, n_kv, T, d]) of `layer` for the T new tokens and
  // returns the keys and values to attend over, [B, n_kv, length+T, d].
  virtual std::pair<at::Tensor, at::Tensor> Append(int64_t layer, const at::Tensor& k, const at::Tensor& v) = 0;
  // Called once all layers have appended a step of T tokens.
  virtual void Advance(int64_t tokens) = 0;
  // A cache that attends over what it holds where it lies (a paged cache on
  // the CPU, without gathering it) stores k, v as Append does and returns
  // the attention of q ([B, n_h, T, d], already rotated) over its keys and
  // values, [B, T, n_h * d] in q's dtype. Undefined, having stored nothing:
  // the layer calls Append and attends itself.
  virtual at::Tensor AppendAndAttend(int64_t /*layer*/, const at::Tensor& /*q*/, const at::Tensor& /*k*/,
                                     const at::Tensor& /*v*/, int64_t /*sliding_window*/) {
    return at::Tensor();
  }
};

// A cache of one batch in contiguous storage, allocated once for
// `capacity` positions of every row; Append writes in place.
class DenseKvCache final : public KvCache {
 public:
  DenseKvCache(const LlamaConfig& config, int64_t batch, int64_t capacity, at::TensorOptions options);

  int64_t length() const override { return length_; }
  int64_t capacity() const { return capacity_; }
  std::pair<at::Tensor, at::Tensor> Append(int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  void Advance(int64_t tokens) override { length_ += tokens; }
  // Keeps only the batch rows `index` (int64, on the cache's device), in
  // that order: rows that finished decoding leave the batch.
  void KeepRows(const at::Tensor& index);

 private:
  std::vector<at::Tensor> keys_, values_;
  int64_t capacity_;
  int64_t length_ = 0;
};

// How a forward pass without a paged cache attends: the whole [T, S] score
// matrix at once, blocks of it with an online softmax (working memory
// linear in the sequence: policies/model/blocked_attention.h), or
// libtorch's fused kernel (policies/model/fused_attention.h; PyTorch 2.5+).
// kAuto on a CUDA device takes the fused kernel where this libtorch has it
// and one of its fused kernels serves the call (FlashAttention's: half
// precision, causality alone; the memory-efficient one: no grouped heads,
// a mask within kFusedAttentionMaskBytes); otherwise the blocks once T x S
// reaches kBlockedAttentionScores
// (policies/config/attention_blocks.h).
enum class AttentionKind { kAuto, kMaterialised, kBlocked, kFused };

// Per-call inputs that every layer shares.
struct LayerContext {
  at::Tensor cos, sin;        // [B, T, d], model dtype
  at::Tensor attention_bias;  // [B, 1, 1, T, S] additive, 0 or a large negative; only when materialised
  at::Tensor key_real;        // [B, S] bool: the real tokens (blocked attention's mask)
  bool fused = false;         // through the fused kernel
  at::Tensor fused_mask;      // its [B, 1, T, S] additive mask; undefined: causal alone
};

// Builds rotary tables and the causal + padding mask for a step.
// `attention_mask` is [B, S] (1 for real tokens, 0 for padding) and covers
// the cached tokens plus the T new ones. Blocked attention builds its mask
// per block, so it gets no attention_bias; the fused kernel gets a mask
// only where causality alone is not enough.
// `inverse_frequencies` are the rotary tables' (RotaryInverseFrequencies)
// on the mask's device; undefined: made here and copied there, which a
// CUDA graph cannot capture.
LayerContext MakeLayerContext(const LlamaConfig& config, const at::Tensor& attention_mask, int64_t new_tokens,
                              at::ScalarType dtype, AttentionKind attention = AttentionKind::kAuto,
                              const at::Tensor& inverse_frequencies = {});

// RoPE's inverse frequencies, [head_dim / 2] float32 on the CPU, as HF
// computes them (with the config's scaling).
at::Tensor RotaryInverseFrequencies(const LlamaConfig& config);

// Position of every token: the count of real tokens before it, so that
// left padding does not shift positions (HF convention). [B, S] int64.
at::Tensor PositionIdsFromMask(const at::Tensor& attention_mask);

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

struct LoraApply;
class LoraAdapters;

// One decoder layer: hidden [B, T, H] -> [B, T, H]. `cache` may be null;
// `lora`, when given, adds its adapters to the projections.
at::Tensor DecoderLayerForward(const LlamaConfig& config, const LlamaLayerWeights& w, const at::Tensor& hidden,
                               const LayerContext& ctx, KvCache* cache, int64_t layer_index,
                               const LoraApply* lora = nullptr);

class LayerSource;

class LlamaModel {
 public:
  // With `layers` set, decoder layers are drawn from it (streamed by the
  // offload engine) and weights.layers should be empty; `layers` must outlive
  // the model, and forward calls throw if a fetch fails.
  LlamaModel(LlamaConfig config, LlamaHead head, LlamaWeights weights, LayerSource* layers = nullptr);

  // Loads config.json and the safetensors weights of a HF model directory,
  // converting to `dtype` (at::kFloat or at::kBFloat16). Errors name the
  // file and tensor: missing tensors, wrong shapes, unsupported dtypes.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& dir, LlamaHead head, at::ScalarType dtype);

  // Fresh weights drawn from N(0, init_std), norms at 1; reproducible for a seed.
  static std::unique_ptr<LlamaModel> RandomInit(const LlamaConfig& config, LlamaHead head, at::ScalarType dtype,
                                                uint64_t seed, double init_std = 0.02);

  // Writes config.json and model.safetensors (or shards above
  // max_shard_bytes) in HF layout, in the weights' own dtype.
  absl::Status Save(const std::string& dir, size_t max_shard_bytes = 0) const;

  // Final-normed hidden states [B, T, H] for the T new tokens `input_ids`
  // ([B, T] int64). `attention_mask` is [B, S] over cached + new tokens.
  at::Tensor Hidden(const at::Tensor& input_ids, const at::Tensor& attention_mask, KvCache* cache = nullptr) const;

  // LM logits [B, T, V] in float32. Requires kLanguageModel.
  at::Tensor Logits(const at::Tensor& input_ids, const at::Tensor& attention_mask, KvCache* cache = nullptr) const;

  // LM logits [..., V] float32 for hidden states from Hidden().
  at::Tensor LogitsFromHidden(const at::Tensor& hidden) const;
  // LM logits [B, R, V] float32 at `positions` ([B, R] int64 indices into
  // the sequence) only: the head is skipped everywhere else.
  at::Tensor LogitsAt(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& positions) const;

  // Scalar head read at each row's last real token: [B, num_labels] float32.
  // Requires kScalar.
  at::Tensor Scores(const at::Tensor& input_ids, const at::Tensor& attention_mask) const;
  // Scalar head at every position: [B, T, num_labels] float32 (critic values).
  at::Tensor TokenScores(const at::Tensor& input_ids, const at::Tensor& attention_mask) const;

  // Adapters every forward applies from now on (null: none, the base), over
  // an optional starting adapter `frozen` (a PEFT adapter the job started
  // from). They must outlive their use; the model does not own them, so a
  // model without `adapters` over the same weights is the frozen base.
  void UseAdapters(const LoraAdapters* adapters, const LoraAdapters* frozen = nullptr) {
    adapters_ = adapters;
    frozen_adapters_ = frozen;
  }
  const LoraAdapters* adapters() const { return adapters_; }

  const LlamaConfig& config() const { return config_; }
  LlamaHead head() const { return head_; }
  // The resident weights. Tensors are handles: a copy shares their storage.
  const LlamaWeights& weights() const { return weights_; }
  at::ScalarType dtype() const { return weights_.embed_tokens.scalar_type(); }
  // Where the resident weights (and so inputs and activations) live.
  at::Device device() const { return weights_.embed_tokens.device(); }
  // Whether the decoder layers come from a LayerSource (streamed) rather
  // than the resident weights.
  bool streams_layers() const { return layer_source_ != nullptr; }
  // Every parameter with its HF name; tied heads appear once.
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() const;

 private:
  const at::Tensor& OutputHead() const;

  LlamaConfig config_;
  LlamaHead head_;
  LlamaWeights weights_;
  LayerSource* layer_source_ = nullptr;
  at::Tensor inverse_frequencies_;  // RotaryInverseFrequencies on device()
  const LoraAdapters* adapters_ = nullptr;
  const LoraAdapters* frozen_adapters_ = nullptr;
  // Layer `l`'s adapters for an inference pass; `frozen` is the storage the
  // result points to for the starting adapter.
  LoraApply AdaptersFor(int64_t l, LoraApply* frozen) const;
};

// The scalar head's output at each row's last real token: [B, T, L] with
// mask [B, T] -> [B, L].
at::Tensor AtLastToken(const at::Tensor& per_token, const at::Tensor& attention_mask);

// Rows of `per_token` [B, T, H] at `positions` [B, R] -> [B, R, H]; an
// undefined `positions` keeps them all.
at::Tensor AtPositions(const at::Tensor& per_token, const at::Tensor& positions);

// log p(targets) under `logits`: [B, T, V] x [B, T] -> [B, T] float32.
at::Tensor TokenLogProbs(const at::Tensor& logits, const at::Tensor& targets);

// Entropy of each position's distribution: [B, T, V] -> [B, T] float32.
at::Tensor TokenEntropy(const at::Tensor& logits);

// log p(ids[t] | ids[<t]) for t = 1..S-1 of each row: [B, S] -> [B, S-1].
// Positions whose target is padding hold 0.
at::Tensor SequenceLogProbs(const LlamaModel& model, const at::Tensor& ids, const at::Tensor& attention_mask);

// Estimated device bytes that running one decoder layer over [batch, seq]
// tokens needs besides its weights (policies/config/layer_memory.h): a
// no-grad forward's, or the layer-wise trainer's recomputation and
// backward with the layer's input and gradients. Used to keep room for
// compute when layers are streamed under a device budget.
size_t LayerWorkingBytes(const LlamaConfig& config, int64_t batch, int64_t seq, at::ScalarType dtype, bool training);

// Parses "fp32" / "bf16" (also "float32", "bfloat16").
absl::StatusOr<at::ScalarType> ParseModelDType(const std::string& name);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_MODEL_LLAMA_H_
