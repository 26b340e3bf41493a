#!/usr/bin/env python3
"""Independent reference for the C++ Llama-family decoder: writes a
random-weight HF-layout model directory with its own safetensors writer, runs
the Hugging Face *ForCausalLM / *ForSequenceClassification forward as HF's
eager implementations compute it (pure torch) for Llama, Mistral (sliding
window), Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm, explicit
head_dim), and writes the expected outputs.

Usage: llama_reference.py OUT_DIR VARIANT [lora]
  VARIANT: gqa_untied | mha_tied | gqa_sharded | scalar | mistral | qwen2 | qwen3 | qwen3_scalar
Writes OUT_DIR/model/ (config.json, safetensors) and OUT_DIR/expected.json.
With "lora" (language-model variants), also OUT_DIR/adapter/, a LoRA adapter
written as PEFT writes one (rank 4 on every projection, random A and B), and
in expected.json the adapted model's padded logits and the gradients of
every A and B under the mean next-token negative log-likelihood, computed
the way PEFT's LoRA layer computes its forward (base + scaling * B(A(x))).
"""
import json
import math
import os
import struct
import sys

import torch

VARIANTS = {
    "gqa_untied": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=8,
                       num_key_value_heads=2, tie_word_embeddings=False, shards=1),
    "mha_tied": dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=4, tie_word_embeddings=True, shards=1),
    "gqa_sharded": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=1, tie_word_embeddings=False, shards=3, rope_theta=500000.0),
    "scalar": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=8,
                   num_key_value_heads=4, tie_word_embeddings=False, shards=1, scalar=True),
    # A window of 4 keys: the 7- and 11-token prompts attend past it.
    "mistral": dict(model_type="mistral", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False, shards=1,
                    sliding_window=4, rope_theta=1000000.0),
    "qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, shards=1,
                  rope_theta=1000000.0, use_sliding_window=False),
    # head_dim 32 with 4 heads: the attention is 128 wide in a 64-wide model.
    "qwen3": dict(model_type="qwen3", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                  shards=2, rope_theta=1000000.0, attention_bias=False, use_sliding_window=False),
    "qwen3_scalar": dict(model_type="qwen3", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                         shards=1, scalar=True),
}
CLASS_PREFIX = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
VOCAB = 97
PROMPTS = [[1, 5, 9, 23, 44, 7, 81], [1, 60], [1, 3, 3, 3, 90, 12, 2, 77, 30, 11, 4]]
GREEDY_NEW_TOKENS = 8

DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_safetensors(path, tensors):
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors:
        t = t.contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def make_weights(cfg, scalar):
    g = torch.Generator().manual_seed(1234)
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = head_dim(cfg)
    w = {"model.embed_tokens.weight": torch.randn(VOCAB, h, generator=g) * 0.5}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
        w[p + "self_attn.q_proj.weight"] = torch.randn(nh * d, h, generator=g) / math.sqrt(h)
        w[p + "self_attn.k_proj.weight"] = torch.randn(nkv * d, h, generator=g) / math.sqrt(h)
        w[p + "self_attn.v_proj.weight"] = torch.randn(nkv * d, h, generator=g) / math.sqrt(h)
        if cfg["model_type"] == "qwen2":
            for name, n in (("q", nh), ("k", nkv), ("v", nkv)):
                w[p + f"self_attn.{name}_proj.bias"] = 0.3 * torch.randn(n * d, generator=g)
        if cfg["model_type"] == "qwen3":
            for name in ("q", "k"):
                w[p + f"self_attn.{name}_norm.weight"] = 1 + 0.2 * torch.randn(d, generator=g)
        w[p + "self_attn.o_proj.weight"] = torch.randn(h, nh * d, generator=g) / math.sqrt(nh * d)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
        w[p + "mlp.gate_proj.weight"] = torch.randn(i, h, generator=g) / math.sqrt(h)
        w[p + "mlp.up_proj.weight"] = torch.randn(i, h, generator=g) / math.sqrt(h)
        w[p + "mlp.down_proj.weight"] = torch.randn(h, i, generator=g) / math.sqrt(i)
    w["model.norm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    if scalar:
        w["score.weight"] = torch.randn(1, h, generator=g) / math.sqrt(h)
    elif not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = torch.randn(VOCAB, h, generator=g) / math.sqrt(h)
    return w


# ---- HF Llama eager forward (mirrors transformers' modeling_llama) ----

def rms_norm(x, weight, eps):
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


LORA_RANK, LORA_ALPHA = 4, 8.0
LORA_MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def make_lora(cfg, w):
    """PEFT-named adapters (base_model.model.<module>.lora_{A,B}.weight) with leaves that require grad."""
    g = torch.Generator().manual_seed(4321)
    lora = {}
    for l in range(cfg["num_hidden_layers"]):
        for name, parent in LORA_MODULES.items():
            out_features, in_features = w[f"model.layers.{l}.{parent}.{name}.weight"].shape
            prefix = f"base_model.model.model.layers.{l}.{parent}.{name}"
            lora[prefix + ".lora_A.weight"] = (torch.rand(LORA_RANK, in_features, generator=g) * 2 - 1) / math.sqrt(in_features)
            lora[prefix + ".lora_B.weight"] = 0.2 * torch.randn(out_features, LORA_RANK, generator=g)
    for t in lora.values():
        t.requires_grad_(True)
    return lora


def linear(w, lora, name, x):
    """x W^T, plus PEFT's LoRA term when `lora` holds adapters for this module."""
    out = x @ w[name + ".weight"].T
    if lora is not None:
        prefix = "base_model.model." + name
        out = out + (LORA_ALPHA / LORA_RANK) * ((x @ lora[prefix + ".lora_A.weight"].T) @ lora[prefix + ".lora_B.weight"].T)
    return out


def forward(cfg, w, input_ids, attention_mask, lora=None):
    """Returns final hidden states [B, T, H] for full sequences (no cache)."""
    h, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = head_dim(cfg)
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    bsz, seq = input_ids.shape
    # position ids as HF generate() builds them from the attention mask
    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = (inv_freq[None, :, None].expand(bsz, -1, 1) @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    # 4-d causal mask with padding, min-value filled
    min_value = torch.finfo(torch.float32).min
    causal = torch.full((seq, seq), min_value).triu(1)
    window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None
    if window:
        # HF's sliding-window mask: query i sees keys j with i - window < j <= i.
        i_pos, j_pos = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
        causal = causal.masked_fill(j_pos <= i_pos - window, min_value)
    mask = causal[None, None].expand(bsz, 1, seq, seq).clone()
    pad = attention_mask[:, None, None, :] == 0
    mask = mask.masked_fill(pad, min_value)
    x = torch.nn.functional.embedding(input_ids, w["model.embed_tokens.weight"])
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        residual = x
        y = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        def project(name, n):
            out = linear(w, lora, p + f"self_attn.{name}_proj", y)
            if p + f"self_attn.{name}_proj.bias" in w:
                out = out + w[p + f"self_attn.{name}_proj.bias"]
            out = out.view(bsz, seq, n, d)
            if p + f"self_attn.{name}_norm.weight" in w:  # Qwen3: per head, before RoPE
                out = rms_norm(out, w[p + f"self_attn.{name}_norm.weight"], eps)
            return out.transpose(1, 2)
        q, k, v = project("q", nh), project("k", nkv), project("v", nkv)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv
        k = k[:, :, None].expand(bsz, nkv, rep, seq, d).reshape(bsz, nh, seq, d)
        v = v[:, :, None].expand(bsz, nkv, rep, seq, d).reshape(bsz, nh, seq, d)
        scores = q @ k.transpose(2, 3) / math.sqrt(d) + mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        attn = (probs @ v).transpose(1, 2).reshape(bsz, seq, nh * d)
        x = residual + linear(w, lora, p + "self_attn.o_proj", attn)
        residual = x
        y = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(linear(w, lora, p + "mlp.gate_proj", y))
        x = residual + linear(w, lora, p + "mlp.down_proj", gate * linear(w, lora, p + "mlp.up_proj", y))
    return rms_norm(x, w["model.norm.weight"], eps)


def lm_head(cfg, w):
    return w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]


def left_pad(prompts):
    longest = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, longest - len(p):] = torch.tensor(p)
        mask[b, longest - len(p):] = 1
    return ids, mask


def main():
    out_dir, variant = sys.argv[1], sys.argv[2]
    spec = dict(VARIANTS[variant])
    shards, scalar = spec.pop("shards"), spec.pop("scalar", False)
    spec.setdefault("model_type", "llama")
    cls = CLASS_PREFIX[spec["model_type"]] + ("ForSequenceClassification" if scalar else "ForCausalLM")
    cfg = dict(spec, vocab_size=VOCAB, max_position_embeddings=128, rms_norm_eps=1e-6,
               rope_theta=spec.get("rope_theta", 10000.0), bos_token_id=1, eos_token_id=2,
               hidden_act="silu", torch_dtype="float32", architectures=[cls])
    if scalar:
        cfg["pad_token_id"] = 0
        cfg["num_labels"] = 1
    model_dir = os.path.join(out_dir, "model")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    w = make_weights(cfg, scalar)
    names = list(w)
    if shards == 1:
        write_safetensors(os.path.join(model_dir, "model.safetensors"), [(n, w[n]) for n in names])
    else:
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            write_safetensors(os.path.join(model_dir, fname), [(n, w[n]) for n in part])
            weight_map.update({n: fname for n in part})
        total = sum(t.numel() * 4 for t in w.values())
        with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)

    expected = {"prompts": PROMPTS}
    with torch.no_grad():
        if scalar:
            ids, mask = left_pad(PROMPTS)
            hidden = forward(cfg, w, ids, mask)
            last = mask.shape[1] - 1  # left padding: the last column is each row's last real token
            expected["scores"] = (hidden[:, last] @ w["score.weight"].T)[:, 0].tolist()
        else:
            head = lm_head(cfg, w)
            expected["logits"] = []
            expected["greedy"] = []
            for p in PROMPTS:
                ids = torch.tensor([p])
                mask = torch.ones_like(ids)
                expected["logits"].append((forward(cfg, w, ids, mask) @ head.T)[0].tolist())
                seq = list(p)
                for _ in range(GREEDY_NEW_TOKENS):
                    ids = torch.tensor([seq])
                    logits = forward(cfg, w, ids, torch.ones_like(ids)) @ head.T
                    seq.append(int(logits[0, -1].argmax()))
                expected["greedy"].append(seq[len(p):])
            ids, mask = left_pad(PROMPTS)
            logits = forward(cfg, w, ids, mask) @ head.T
            expected["padded_logits"] = logits.tolist()
    if len(sys.argv) > 3 and sys.argv[3] == "lora":
        expected.update(lora_expectations(cfg, w, os.path.join(out_dir, "adapter")))
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f)


def lora_expectations(cfg, w, adapter_dir):
    lora = make_lora(cfg, w)
    os.makedirs(adapter_dir, exist_ok=True)
    write_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"),
                      [(n, t.detach()) for n, t in lora.items()])
    with open(os.path.join(adapter_dir, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_RANK, "lora_alpha": LORA_ALPHA,
                   "lora_dropout": 0.0, "target_modules": sorted(LORA_MODULES), "bias": "none",
                   "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "modules_to_save": None,
                   "base_model_name_or_path": "model", "inference_mode": True, "rank_pattern": {},
                   "alpha_pattern": {}, "layers_to_transform": None}, f, indent=2)
    ids, mask = left_pad(PROMPTS)
    logits = forward(cfg, w, ids, mask, lora) @ lm_head(cfg, w).T
    # Mean next-token NLL over positions whose token and next token are real.
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    real = (mask[:, :-1] * mask[:, 1:]).float()
    loss = -(logp * real).sum() / real.sum()
    loss.backward()
    return {"lora_padded_logits": logits.detach().tolist(), "lora_loss": loss.item(),
            "lora_grads": {n[len("base_model.model."):]: t.grad.reshape(-1).tolist() for n, t in lora.items()}}


if __name__ == "__main__":
    main()
