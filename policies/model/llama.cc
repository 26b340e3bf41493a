#include "policies/model/llama.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/interrupt.h"
#include "base/status_macros.h"
#include "policies/checkpoint/safetensors.h"
#include "policies/checkpoint/tensor_io.h"
#include "policies/config/layer_memory.h"
#include "policies/model/blocked_attention.h"
#include "policies/model/fused_attention.h"
#include "policies/model/layer_source.h"
#include "policies/model/lora.h"

namespace strata::policies {

LlamaLayerWeights LlamaLayerWeights::Layout(const LlamaConfig& config) {
  LlamaLayerWeights w;
  w.has_qkv_bias = config.qkv_bias;
  w.has_qk_norm = config.qk_norm;
  return w;
}

std::vector<std::pair<std::string, at::Tensor*>> LlamaLayerWeights::Named() {
  std::vector<std::pair<std::string, at::Tensor*>> out = {{"input_layernorm.weight", &input_layernorm},
                                                          {"self_attn.q_proj.weight", &q_proj},
                                                          {"self_attn.k_proj.weight", &k_proj},
                                                          {"self_attn.v_proj.weight", &v_proj}};
  if (has_qkv_bias) {
    out.insert(out.end(), {{"self_attn.q_proj.bias", &q_bias},
                           {"self_attn.k_proj.bias", &k_bias},
                           {"self_attn.v_proj.bias", &v_bias}});
  }
  if (has_qk_norm) out.insert(out.end(), {{"self_attn.q_norm.weight", &q_norm}, {"self_attn.k_norm.weight", &k_norm}});
  out.insert(out.end(), {{"self_attn.o_proj.weight", &o_proj},
                         {"post_attention_layernorm.weight", &post_attention_layernorm},
                         {"mlp.gate_proj.weight", &gate_proj},
                         {"mlp.up_proj.weight", &up_proj},
                         {"mlp.down_proj.weight", &down_proj}});
  return out;
}

absl::StatusOr<LlamaLayerWeights> LlamaLayerWeights::FromNamed(const std::vector<std::string>& names,
                                                               std::vector<at::Tensor> tensors) {
  LlamaLayerWeights w;
  for (const std::string& name : names) {
    w.has_qkv_bias = w.has_qkv_bias || name == "self_attn.q_proj.bias";
    w.has_qk_norm = w.has_qk_norm || name == "self_attn.q_norm.weight";
  }
  auto slots = w.Named();
  if (names.size() != slots.size() || tensors.size() != names.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a layer of ", names.size(), " named tensors (", tensors.size(),
                                                   " given) is not a whole layer of ", slots.size()));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].first != names[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer tensor ", i, " is '", names[i], "', expected '", slots[i].first, "'"));
    }
    *slots[i].second = std::move(tensors[i]);
  }
  return w;
}

namespace {

// Expected shape of each layer tensor, in the order of Named().
std::vector<std::vector<int64_t>> LayerShapes(const LlamaConfig& c) {
  const int64_t h = c.hidden_size, i = c.intermediate_size, d = c.head_dim;
  const int64_t q = c.num_attention_heads * d, kv = c.num_key_value_heads * d;
  std::vector<std::vector<int64_t>> shapes = {{h}, {q, h}, {kv, h}, {kv, h}};
  if (c.qkv_bias) shapes.insert(shapes.end(), {{q}, {kv}, {kv}});
  if (c.qk_norm) shapes.insert(shapes.end(), {{d}, {d}});
  shapes.insert(shapes.end(), {{h, q}, {h}, {i, h}, {i, h}, {h, i}});
  return shapes;
}

std::string LayerPrefix(size_t index) { return absl::StrCat("model.layers.", index, "."); }

// HF's rotary inverse frequencies, including rope_scaling.
}  // namespace

at::Tensor RotaryInverseFrequencies(const LlamaConfig& c) {
  const int64_t d = c.head_dim;
  at::Tensor exponent = at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d);
  at::Tensor inv_freq = 1.0 / at::pow(c.rope_theta, exponent);
  const RopeScaling& s = c.rope_scaling;
  switch (s.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLinear:
      inv_freq = inv_freq / s.factor;
      break;
    case RopeScaling::Type::kLlama3: {
      const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
      const double low_freq_wavelen = old_ctx / s.low_freq_factor;
      const double high_freq_wavelen = old_ctx / s.high_freq_factor;
      at::Tensor wavelen = 2 * M_PI / inv_freq;
      at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
      at::Tensor smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
      at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
      inv_freq = at::where(medium, smoothed, scaled);
      break;
    }
  }
  return inv_freq;
}

namespace {

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

}  // namespace

DenseKvCache::DenseKvCache(const LlamaConfig& config, int64_t batch, int64_t capacity, at::TensorOptions options)
    : capacity_(capacity) {
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    keys_.push_back(at::zeros({batch, config.num_key_value_heads, capacity, config.head_dim}, options));
    values_.push_back(at::zeros({batch, config.num_key_value_heads, capacity, config.head_dim}, options));
  }
}

std::pair<at::Tensor, at::Tensor> DenseKvCache::Append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  const int64_t t = k.size(2);
  TORCH_CHECK(length_ + t <= capacity_, "KV cache overflow: ", length_, " + ", t, " > capacity ", capacity_);
  keys_[layer].narrow(2, length_, t).copy_(k);
  values_[layer].narrow(2, length_, t).copy_(v);
  return {keys_[layer].narrow(2, 0, length_ + t), values_[layer].narrow(2, 0, length_ + t)};
}

void DenseKvCache::KeepRows(const at::Tensor& index) {
  for (auto& k : keys_) k = k.index_select(0, index);
  for (auto& v : values_) v = v.index_select(0, index);
}

at::Tensor PositionIdsFromMask(const at::Tensor& attention_mask) {
  at::Tensor positions = attention_mask.to(at::kLong).cumsum(-1) - 1;
  return positions.clamp_min(0);
}

LayerContext MakeLayerContext(const LlamaConfig& config, const at::Tensor& attention_mask, int64_t new_tokens,
                              at::ScalarType dtype, AttentionKind attention, const at::Tensor& inverse_frequencies) {
  const int64_t s = attention_mask.size(1);
  const int64_t t = new_tokens;
  TORCH_CHECK(t <= s, "attention mask covers ", s, " positions, fewer than the ", t, " new tokens");
  LayerContext ctx;
  const at::Tensor positions = PositionIdsFromMask(attention_mask).narrow(1, s - t, t);
  const at::Tensor inverse = inverse_frequencies.defined() ? inverse_frequencies
                                                           : RotaryInverseFrequencies(config).to(positions.device());
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inverse;
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  ctx.cos = emb.cos().to(dtype);
  ctx.sin = emb.sin().to(dtype);

  ctx.key_real = attention_mask.to(at::kBool);
  if (attention == AttentionKind::kFused ||
      (attention == AttentionKind::kAuto && attention_mask.is_cuda() && FusedAttentionAvailable())) {
    // Causality alone suffices when every key is real, there is no window
    // to cut, and queries are keys (one sync a forward pass to know it).
    const bool window_cuts = config.sliding_window > 0 && config.sliding_window < s;
    const bool causal_alone = t == s && !window_cuts && ctx.key_real.all().item<bool>();
    const int64_t mask_bytes = attention_mask.size(0) * t * s * static_cast<int64_t>(c10::elementSize(dtype));
    // Only where a fused kernel serves the call: FlashAttention's (half
    // precision, no mask) or the memory-efficient one (no grouped heads,
    // a mask within its bound). Elsewhere libtorch would fall back to its
    // math kernel, which holds every score: blocks instead.
    const bool flash = (dtype == at::kBFloat16 || dtype == at::kHalf) && causal_alone;
    const bool efficient = config.num_key_value_heads == config.num_attention_heads &&
                           (causal_alone || mask_bytes <= kFusedAttentionMaskBytes);
    if (attention == AttentionKind::kFused || flash || efficient) {
      ctx.fused = true;
      if (!causal_alone) {
        ctx.fused_mask = AdditiveAttentionMask(ctx.key_real, t, config.sliding_window, dtype,
                                               /*pad_queries_see_themselves=*/true);
      }
      return ctx;
    }
  }
  if (attention == AttentionKind::kBlocked || (attention == AttentionKind::kAuto && BlockedAttentionFor(t, s))) {
    return ctx;
  }
  ctx.attention_bias = AdditiveAttentionMask(ctx.key_real, t, config.sliding_window, dtype).unsqueeze(1);
  return ctx;
}

void MoveToDevice(LlamaWeights& w, const at::Device& device, bool include_layers) {
  for (at::Tensor* t : {&w.embed_tokens, &w.norm, &w.lm_head, &w.score}) {
    if (t->defined()) *t = t->to(device);
  }
  if (!include_layers) return;
  for (LlamaLayerWeights& layer : w.layers) {
    for (auto& [name, t] : layer.Named()) *t = t->to(device);
  }
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // Variance in float32 whatever the model dtype, as HF does.
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor DecoderLayerForward(const LlamaConfig& config, const LlamaLayerWeights& w, const at::Tensor& hidden,
                               const LayerContext& ctx, KvCache* cache, int64_t layer_index, const LoraApply* lora) {
  const int64_t b = hidden.size(0), t = hidden.size(1);
  const int64_t n_h = config.num_attention_heads, n_kv = config.num_key_value_heads, d = config.head_dim;
  const int64_t groups = n_h / n_kv;

  const at::Tensor x = RmsNorm(hidden, w.input_layernorm, config.rms_norm_eps);
  const at::Tensor cos = ctx.cos.unsqueeze(1), sin = ctx.sin.unsqueeze(1);
  // Undefined biases and norms (families without them) are skipped.
  auto heads = [&](const at::Tensor& proj, const at::Tensor& bias, const at::Tensor& norm, int64_t n,
                   LoraModule module) {
    at::Tensor y = LoraLinear(x, proj, bias, lora, module).view({b, t, n, d});
    if (norm.defined()) y = RmsNorm(y, norm, config.rms_norm_eps);
    return y.transpose(1, 2);
  };
  const at::Tensor q = ApplyRope(heads(w.q_proj, w.q_bias, w.q_norm, n_h, LoraModule::kQ), cos, sin);
  at::Tensor k = ApplyRope(heads(w.k_proj, w.k_bias, w.k_norm, n_kv, LoraModule::kK), cos, sin);
  at::Tensor v = heads(w.v_proj, w.v_bias, at::Tensor(), n_kv, LoraModule::kV);
  at::Tensor attended;
  if (cache != nullptr) attended = cache->AppendAndAttend(layer_index, q, k, v, config.sliding_window);
  if (!attended.defined() && cache != nullptr) std::tie(k, v) = cache->Append(layer_index, k, v);
  if (!attended.defined() && ctx.fused) {
    attended = FusedAttention(q, k, v, ctx.fused_mask).transpose(1, 2).reshape({b, t, n_h * d});
  }
  if (!attended.defined() && !ctx.attention_bias.defined()) {
    BlockedAttentionOptions blocked;
    blocked.window = config.sliding_window;
    attended = BlockedAttention(q, k, v, ctx.key_real, blocked).transpose(1, 2).reshape({b, t, n_h * d});
  }
  if (!attended.defined()) {
    const int64_t s = k.size(2);
    // Grouped-query attention without copying K/V: the `groups` query heads
    // that share a key/value head are stacked along the query axis.
    const at::Tensor q_grouped = q.reshape({b, n_kv, groups * t, d});
    at::Tensor scores = at::matmul(q_grouped, k.transpose(-1, -2)) * (1.0 / std::sqrt(static_cast<double>(d)));
    scores = scores.view({b, n_kv, groups, t, s}) + ctx.attention_bias;
    const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    attended = at::matmul(probs.view({b, n_kv, groups * t, s}), v)
                   .view({b, n_h, t, d})
                   .transpose(1, 2)
                   .reshape({b, t, n_h * d});
  }
  const at::Tensor h = hidden + LoraLinear(attended, w.o_proj, at::Tensor(), lora, LoraModule::kO);

  const at::Tensor y = RmsNorm(h, w.post_attention_layernorm, config.rms_norm_eps);
  const at::Tensor gate = LoraLinear(y, w.gate_proj, at::Tensor(), lora, LoraModule::kGate);
  const at::Tensor up = LoraLinear(y, w.up_proj, at::Tensor(), lora, LoraModule::kUp);
  const at::Tensor mlp = LoraLinear(at::silu(gate) * up, w.down_proj, at::Tensor(), lora, LoraModule::kDown);
  return h + mlp;
}

LlamaModel::LlamaModel(LlamaConfig config, LlamaHead head, LlamaWeights weights, LayerSource* layers)
    : config_(std::move(config)), head_(head), weights_(std::move(weights)), layer_source_(layers) {
  if (weights_.embed_tokens.defined()) inverse_frequencies_ = RotaryInverseFrequencies(config_).to(device());
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& dir, LlamaHead head,
                                                             at::ScalarType dtype) {
  STRATA_ASSIGN_OR_RETURN(auto config, LlamaConfig::Load(dir));
  STRATA_ASSIGN_OR_RETURN(auto checkpoint, Checkpoint::Open(dir));
  const Checkpoint& ckpt = *checkpoint;
  const LlamaConfig& c = config;

  auto load = [&](const std::string& name, std::vector<int64_t> shape) -> absl::StatusOr<at::Tensor> {
    // A large model takes minutes to read: a cancelled job's load stops here.
    STRATA_RETURN_IF_ERROR(CheckInterrupt("while loading a model"));
    STRATA_ASSIGN_OR_RETURN(auto view, ckpt.Get(name));
    auto tensor = ToTensorWithShape(view, shape, dtype);
    ReleaseMappedPages(view.data);  // copied out: the file's pages need not stay resident
    if (!tensor.ok()) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", tensor.status().message()));
    return tensor;
  };

  LlamaWeights w;
  STRATA_ASSIGN_OR_RETURN(auto embed, load("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
  w.embed_tokens = embed;
  const auto shapes = LayerShapes(c);
  w.layers.assign(static_cast<size_t>(c.num_hidden_layers), LlamaLayerWeights::Layout(c));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    auto named = w.layers[l].Named();
    for (size_t p = 0; p < named.size(); ++p) {
      STRATA_ASSIGN_OR_RETURN(auto tensor, load(LayerPrefix(l) + named[p].first, shapes[p]));
      *named[p].second = tensor;
    }
  }
  auto norm = load("model.norm.weight", {c.hidden_size});
  if (!norm.ok()) return norm.status();
  w.norm = *norm;
  if (head == LlamaHead::kLanguageModel) {
    // Some tied checkpoints still carry lm_head.weight; a tied model ignores it.
    if (!c.tie_word_embeddings) {
      auto lm_head = load("lm_head.weight", {c.vocab_size, c.hidden_size});
      if (!lm_head.ok()) return lm_head.status();
      w.lm_head = *lm_head;
    }
  } else {
    auto score = load("score.weight", {c.num_labels, c.hidden_size});
    if (!score.ok()) return score.status();
    w.score = *score;
  }
  return std::make_unique<LlamaModel>(c, head, std::move(w));
}

std::unique_ptr<LlamaModel> LlamaModel::RandomInit(const LlamaConfig& config, LlamaHead head, at::ScalarType dtype,
                                                   uint64_t seed, double init_std) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto normal = [&](std::vector<int64_t> shape) {
    return at::empty(shape, at::kFloat).normal_(0.0, init_std, gen).to(dtype);
  };
  auto ones = [&](int64_t n) { return at::ones({n}, at::TensorOptions().dtype(dtype)); };
  LlamaWeights w;
  w.embed_tokens = normal({config.vocab_size, config.hidden_size});
  const auto shapes = LayerShapes(config);
  w.layers.assign(static_cast<size_t>(config.num_hidden_layers), LlamaLayerWeights::Layout(config));
  for (auto& layer : w.layers) {
    auto named = layer.Named();
    for (size_t p = 0; p < named.size(); ++p) {
      // Norm weights start at 1; biases, unlike HF's zeros, are random too,
      // so that tests of a fresh model exercise them.
      const bool norm = shapes[p].size() == 1 && named[p].first.find(".bias") == std::string::npos;
      *named[p].second = norm ? ones(shapes[p][0]) : normal(shapes[p]);
    }
  }
  w.norm = ones(config.hidden_size);
  if (head == LlamaHead::kLanguageModel && !config.tie_word_embeddings) {
    w.lm_head = normal({config.vocab_size, config.hidden_size});
  }
  if (head == LlamaHead::kScalar) w.score = normal({config.num_labels, config.hidden_size});
  return std::make_unique<LlamaModel>(config, head, std::move(w));
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::NamedParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("model.embed_tokens.weight", weights_.embed_tokens);
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    auto layer = weights_.layers[l];  // Named() hands out pointers; copies share storage.
    for (auto& [name, tensor] : layer.Named()) out.emplace_back(LayerPrefix(l) + name, *tensor);
  }
  out.emplace_back("model.norm.weight", weights_.norm);
  if (weights_.lm_head.defined()) out.emplace_back("lm_head.weight", weights_.lm_head);
  if (weights_.score.defined()) out.emplace_back("score.weight", weights_.score);
  return out;
}

absl::Status LlamaModel::Save(const std::string& dir, size_t max_shard_bytes) const {
  if (!IsDirectory(dir)) return absl::NotFoundError(absl::StrCat("model directory ", dir, " does not exist"));
  TensorWriteBatch batch;
  for (const auto& [name, tensor] : NamedParameters()) {
    STRATA_RETURN_IF_ERROR(batch.Add(name, tensor));
  }
  STRATA_RETURN_IF_ERROR(WriteCheckpoint(dir, batch.entries(), max_shard_bytes));
  LlamaConfig config = config_;
  config.torch_dtype = dtype() == at::kBFloat16 ? "bfloat16" : dtype() == at::kHalf ? "float16" : "float32";
  // config.json last: a directory with a config always has its weights.
  return WriteFileAtomically(JoinPath(dir, "config.json"), config.ToJson(head_ == LlamaHead::kScalar));
}

const at::Tensor& LlamaModel::OutputHead() const {
  return weights_.lm_head.defined() ? weights_.lm_head : weights_.embed_tokens;
}

LoraApply LlamaModel::AdaptersFor(int64_t l, LoraApply* frozen) const {
  LoraApply apply = adapters_ != nullptr ? adapters_->ApplyFor(l) : LoraApply();
  if (frozen_adapters_ != nullptr) {
    *frozen = frozen_adapters_->ApplyFor(l);
    apply.frozen = frozen;
  }
  return apply;
}

at::Tensor LlamaModel::Hidden(const at::Tensor& input_ids, const at::Tensor& attention_mask, KvCache* cache) const {
  const int64_t t = input_ids.size(1);
  const int64_t cached = cache != nullptr ? cache->length() : 0;
  TORCH_CHECK(attention_mask.size(0) == input_ids.size(0) && attention_mask.size(1) == cached + t,
              "attention_mask must be [batch, cached + new] = [", input_ids.size(0), ", ", cached + t, "], got ",
              attention_mask.sizes());
  const LayerContext ctx = MakeLayerContext(config_, attention_mask, t, dtype(), AttentionKind::kAuto,
                                            inverse_frequencies_);
  at::Tensor h = at::embedding(weights_.embed_tokens, input_ids);
  if (layer_source_ != nullptr) {
    std::vector<int64_t> order(static_cast<size_t>(config_.num_hidden_layers));
    std::iota(order.begin(), order.end(), 0);
    const absl::Status begun = layer_source_->BeginPass(order);
    TORCH_CHECK(begun.ok(), std::string(begun.message()));
    for (int64_t l : order) {
      auto w = layer_source_->Acquire(l);
      if (!w.ok()) {
        layer_source_->EndPass();
        TORCH_CHECK(false, std::string(w.status().message()));
      }
      LoraApply frozen;
      const LoraApply lora = AdaptersFor(l, &frozen);
      h = DecoderLayerForward(config_, *w, h, ctx, cache, l, &lora);
      // Let go of the weights first: a streamer reuses a released layer's
      // buffers for the next fetch only once nothing refers to them.
      *w = LlamaLayerWeights();
      layer_source_->Release(l);
    }
    layer_source_->EndPass();
  } else {
    for (size_t l = 0; l < weights_.layers.size(); ++l) {
      const int64_t layer = static_cast<int64_t>(l);
      LoraApply frozen;
      const LoraApply lora = AdaptersFor(layer, &frozen);
      h = DecoderLayerForward(config_, weights_.layers[l], h, ctx, cache, layer, &lora);
    }
  }
  if (cache != nullptr) cache->Advance(t);
  return RmsNorm(h, weights_.norm, config_.rms_norm_eps);
}

at::Tensor LlamaModel::Logits(const at::Tensor& input_ids, const at::Tensor& attention_mask, KvCache* cache) const {
  TORCH_CHECK(head_ == LlamaHead::kLanguageModel, "Logits() needs a language-model head");
  return at::linear(Hidden(input_ids, attention_mask, cache), OutputHead()).to(at::kFloat);
}

at::Tensor LlamaModel::LogitsFromHidden(const at::Tensor& hidden) const {
  TORCH_CHECK(head_ == LlamaHead::kLanguageModel, "LogitsFromHidden() needs a language-model head");
  return at::linear(hidden, OutputHead()).to(at::kFloat);
}

at::Tensor LlamaModel::LogitsAt(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                const at::Tensor& positions) const {
  return LogitsFromHidden(AtPositions(Hidden(input_ids, attention_mask), positions));
}

at::Tensor LlamaModel::Scores(const at::Tensor& input_ids, const at::Tensor& attention_mask) const {
  TORCH_CHECK(head_ == LlamaHead::kScalar, "Scores() needs a scalar head");
  const at::Tensor hidden = Hidden(input_ids, attention_mask);
  return at::linear(AtLastToken(hidden, attention_mask), weights_.score).to(at::kFloat);
}

at::Tensor LlamaModel::TokenScores(const at::Tensor& input_ids, const at::Tensor& attention_mask) const {
  TORCH_CHECK(head_ == LlamaHead::kScalar, "TokenScores() needs a scalar head");
  return at::linear(Hidden(input_ids, attention_mask), weights_.score).to(at::kFloat);
}

at::Tensor AtLastToken(const at::Tensor& per_token, const at::Tensor& attention_mask) {
  // Last real token of each row: the largest index whose mask is 1.
  const at::Tensor columns = at::arange(attention_mask.size(1),
                                        at::TensorOptions().dtype(at::kLong).device(attention_mask.device()));
  const at::Tensor index = (attention_mask.to(at::kLong) * columns).argmax(-1);
  return per_token.gather(1, index.view({-1, 1, 1}).expand({per_token.size(0), 1, per_token.size(2)})).squeeze(1);
}

at::Tensor AtPositions(const at::Tensor& per_token, const at::Tensor& positions) {
  if (!positions.defined()) return per_token;
  return per_token.gather(1, positions.unsqueeze(-1).expand({-1, -1, per_token.size(2)}));
}

at::Tensor TokenLogProbs(const at::Tensor& logits, const at::Tensor& targets) {
  return at::log_softmax(logits.to(at::kFloat), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
}

at::Tensor TokenEntropy(const at::Tensor& logits) {
  const at::Tensor logp = at::log_softmax(logits.to(at::kFloat), -1);
  return -(logp.exp() * logp).sum(-1);
}

at::Tensor SequenceLogProbs(const LlamaModel& model, const at::Tensor& ids, const at::Tensor& attention_mask) {
  const int64_t s = ids.size(1);
  const at::Tensor logits = model.Logits(ids, attention_mask).narrow(1, 0, s - 1);
  const at::Tensor logp = TokenLogProbs(logits, ids.narrow(1, 1, s - 1));
  return logp * attention_mask.narrow(1, 1, s - 1).to(at::kFloat);
}

size_t LayerWorkingBytes(const LlamaConfig& c, int64_t batch, int64_t seq, at::ScalarType dtype, bool training) {
  LayerShape s;
  s.rows = batch, s.tokens = seq;
  s.hidden = c.hidden_size, s.intermediate = c.intermediate_size;
  s.heads = c.num_attention_heads, s.kv_heads = c.num_key_value_heads, s.head_dim = c.head_dim;
  s.dtype_bytes = static_cast<int64_t>(c10::elementSize(dtype));
  if (!training) return static_cast<size_t>(LayerForwardBytes(s, seq));
  // Beside the backward: the layer's input and its output's gradient, and
  // the gradients' way home as a GPU sends them (the device is not known
  // here, and a GPU's is the larger).
  LayerGradientBytes grads = FullLayerGradients(s, c.LayerParameters());
  SendHomeInFloat32(s, /*cpu_device=*/false, grads);
  return static_cast<size_t>(2.0 * s.RowsBy(s.hidden) * static_cast<double>(s.dtype_bytes) +
                             LayerBackwardBytes(s, grads));
}

absl::StatusOr<at::ScalarType> ParseModelDType(const std::string& name) {
  if (name == "fp32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  return absl::InvalidArgumentError(absl::StrCat("dtype '", name, "' is not supported (fp32, bf16)"));
}

}  // namespace strata::policies
