#!/usr/bin/env python3
"""Independent check of strata's PEFT adapters: merges a LoRA adapter
directory into its base model the way PEFT's merge_and_unload does
(W + lora_alpha / r * B @ A per targeted module, or / sqrt(r) with
use_rslora), reading both with its own safetensors reader, and writes the
merged model (config.json + model.safetensors, float32).

Usage: peft_merge.py BASE_DIR ADAPTER_DIR OUT_DIR
"""
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_reference import write_safetensors  # noqa: E402  (the reference's own writer)

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=DTYPES[entry["dtype"]])
        out[name] = t.reshape(entry["shape"]).to(torch.float32)
    return out


def main():
    base_dir, adapter_dir, out_dir = sys.argv[1:4]
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        config = json.load(f)
    assert config["peft_type"] == "LORA" and not config.get("use_dora") and not config.get("fan_in_fan_out")
    r = config["r"]
    scale = config["lora_alpha"] / (math.sqrt(r) if config.get("use_rslora") else r)
    weights = read_safetensors(os.path.join(base_dir, "model.safetensors"))
    adapter = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    merged = 0
    for name, a in adapter.items():
        if not name.endswith(".lora_A.weight"):
            continue
        module = name[len("base_model.model."):-len(".lora_A.weight")]
        b = adapter[name.replace(".lora_A.", ".lora_B.")]
        weights[module + ".weight"] = weights[module + ".weight"] + scale * (b @ a)
        merged += 1
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), list(weights.items()))
    with open(os.path.join(base_dir, "config.json")) as f:
        model_config = json.load(f)
    model_config["torch_dtype"] = "float32"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model_config, f)
    print(f"merged {merged} modules")


if __name__ == "__main__":
    main()
