#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/): small,
valid inputs of every format, so that libFuzzer starts from deep inside
each parser rather than from its first error. Run from the repository root;
needs protoc and spm_train (deploy/install-deps.sh installs both)."""
import json
import os
import shutil
import struct
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
SEP = b"\n----\n"


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def safetensors(tensors, metadata=None):
    header, blobs, offset = {}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs += raw
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + blobs


def math_answer_seeds():
    """A model's response and, after SEP, the record's label (math_answer)."""
    put("math_answer", "boxed", "So $x = \\frac{3}{4}$, and the answer is $\\boxed{\\frac{3}{4}}$." + SEP.decode() + "0.75")
    put("math_answer", "gsm8k", "She pays 3 * $24 = $72.\n#### 72" + SEP.decode() + "72")
    put("math_answer", "last-number", "The total is 1,234.5 apples, not -13/2 or .5e3" + SEP.decode() + "1,234.5")
    put("math_answer", "text", "\\boxed{\\text{x + 1}} \\boxed{\\{1,2\\}} #### 5." + SEP.decode() + "\\$50\\%")
    put("math_answer", "regex", "^(a+)+$|\\d{3}-[A-Z]+" + SEP.decode() + "aaaaaaaaaaaaaaaaaaaaaaaab 123-ABC")


def reward_reply_seeds():
    """A reward server's reply body (reward_reply), in OpenRLHF's remote reward protocol."""
    # serve_rm.py's reply: rewards, scores and extra_logs, one entry per query.
    put("reward_reply", "serve-rm", json.dumps({"rewards": [0.5, -1.25, 2.0], "scores": [0.5, -1.25, 2.0],
                                                "extra_logs": {"dummy_scores": [0.5, -1.25, 2.0]}}))
    # Scores as numbers or lists, logs as lists or scalars, an unknown field.
    put("reward_reply", "scores-and-logs", json.dumps({"rewards": [1, 0], "scores": [[1, 0.5], 0],
                                                       "extra_logs": {"acc": [1, 0], "server": "v2", "n": 3},
                                                       "model": "verifier"}))
    put("reward_reply", "bare-number", '{"rewards": 0.75, "scores": null, "extra_logs": null}')
    # What Python's json.dumps writes for a NaN or an infinity: not JSON.
    put("reward_reply", "nan", '{"rewards": [NaN, 1.0], "scores": [Infinity, -Infinity]}')
    # Wrong types: a bool and a string for rewards, a list for extra_logs.
    put("reward_reply", "wrong-type", '{"rewards": [true, "1"], "scores": {"a": 1}, "extra_logs": [1]}')
    put("reward_reply", "top-level-list", "[0.5, 1.0]")


def main():
    # Job specs, with and without overrides.
    for name in ("sft", "reward", "remax", "ppo"):
        put("job_spec", name, read("examples/tiny/%s.yaml" % name))
    put("job_spec", "remax-overrides", read("examples/tiny/remax.yaml") + SEP +
        b"train.lr=1e-4\nmodels.actor.placement.weights=nvme\nmemory.nvme_dir=/nvme\nparallel.workers=2\n")
    put("job_spec", "grpo", read("examples/tiny/remax.yaml") + SEP + b"algorithm=grpo\ngroup.samples_per_prompt=4\n")
    put("job_spec", "7b-ppo", read("examples/llama2-7b/ppo.yaml"))

    # Safetensors: a file, and the same file behind an index.
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    one = safetensors({"a": ("F32", [2, 2], f32), "b": ("BF16", [2], b"\x80\x3f\x00\x40")}, {"format": "pt"})
    index = json.dumps({"metadata": {"total_size": 20},
                        "weight_map": {"a": "model-00001-of-00001.safetensors",
                                       "b": "model-00001-of-00001.safetensors"}}).encode()
    put("safetensors", "file", one)
    put("safetensors", "file-and-index", one + SEP + index)
    put("safetensors", "scalar", safetensors({"s": ("I64", [], struct.pack("<q", 7))}))

    # config.json of the shapes in examples/.
    put("llama_config", "tiny", read("examples/tiny/model.json"))
    put("llama_config", "llama2-7b", read("examples/llama2-7b/config.json"))

    # tokenizer.json (+ tokenizer_config.json).
    put("tokenizer_json", "tiny", read("examples/tiny/data/tokenizer.json"))
    put("tokenizer_json", "tiny-with-config",
        read("examples/tiny/data/tokenizer.json") + SEP + read("examples/tiny/data/tokenizer_config.json"))

    # tokenizer.model: a small SentencePiece model (BPE and unigram, byte fallback).
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            for i in range(200):
                f.write("the quick brown fox %d jumps over the lazy dog; café naïve 日本 %d\n" % (i, i * 7))
        for kind in ("bpe", "unigram"):
            prefix = os.path.join(tmp, kind)
            subprocess.run(["spm_train", "--input=" + text, "--model_prefix=" + prefix, "--vocab_size=320",
                            "--model_type=" + kind, "--byte_fallback=true", "--character_coverage=1.0",
                            "--normalization_rule_name=identity", "--minloglevel=2"],
                           check=True, capture_output=True)
            put("tokenizer_model", kind, read(prefix + ".model"))

    # NVMe store: MANIFEST, then JOURNAL.
    body = "strata-nvme-store 2 1\nslot 1 16 4096 t0-%s.slot t0\n" % fnv1a64(b"t0")
    manifest = body + "end 1 %s\n" % fnv1a64(body.encode())
    head = "strata-nvme-journal 1 1"
    journal = head + " " + fnv1a64(head.encode()) + "\n"
    for line in ("1 slot 4096 t1-x.slot t1", "2 val 8 t1", "3 inv t0", "4 rm t0"):
        journal += line + " " + fnv1a64(line.encode()) + "\n"
    empty = "strata-nvme-store 2 1\n"
    put("nvme_store", "manifest", manifest)
    put("nvme_store", "manifest-and-journal", manifest.encode() + SEP + journal.encode())
    put("nvme_store", "empty", empty + "end 0 %s\n" % fnv1a64(empty.encode()))
    put("nvme_store", "v1", "strata-nvme-store 1\nend 0 0\n")

    # state.json of a checkpoint.
    put("checkpoint_state", "state", json.dumps({"iteration": 4, "metrics_lines": 4, "run_id": "job-0123456789ab",
                                                 "world_size": 2, "algorithm": {"kl_coef": 0.05}}))
    put("checkpoint_state", "legacy", json.dumps({"metrics_lines": 2}))

    math_answer_seeds()
    reward_reply_seeds()

    for target in sorted(os.listdir(CORPUS)):
        print("%-18s %d seeds" % (target, len(os.listdir(os.path.join(CORPUS, target)))))


if __name__ == "__main__":
    main()
