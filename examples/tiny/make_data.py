#!/usr/bin/env python3
"""Writes the tiny demo task's data into examples/tiny/data/ (stdlib only,
deterministic). The hidden rule: a response's score is the fraction of its
letters that are vowels. SFT responses follow English-like letter
frequencies, so the SFT policy starts well below the rule's maximum of 1.0;
preference pairs are labelled by the rule, and RL is scored by it.

    python3 examples/tiny/make_data.py
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data")
LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
# Roughly English letter frequencies (percent), in LETTERS order.
WEIGHTS = [12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0, 1.9,
           1.5, 1.0, 0.8, 0.2, 0.2, 0.1, 0.1]
TOPICS = ["sun", "tree", "river", "stone", "cloud", "bird", "fire", "snow", "wind", "road", "moon", "sea"]


def word(rng):
    return "".join(rng.choices(LETTERS, WEIGHTS, k=rng.randint(2, 5)))


def response(rng):
    return " ".join(word(rng) for _ in range(rng.randint(3, 4)))


def prompt(rng):
    return " ".join(rng.sample(TOPICS, 2)) + " =>"


def rule_score(text):
    letters = [c for c in text if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


def write(name, rows):
    with open(os.path.join(OUT, name), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def preferences(rng, n):
    rows = []
    while len(rows) < n:
        p, a, b = prompt(rng), response(rng), response(rng)
        sa, sb = rule_score(a), rule_score(b)
        if abs(sa - sb) < 0.1:
            continue
        chosen, rejected = (a, b) if sa > sb else (b, a)
        rows.append({"prompt": p, "chosen": chosen, "rejected": rejected})
    return rows


def tokenizer_json():
    # Byte-level BPE without merges: one token per byte, plus three specials.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_chars = {b: chr(c) for b, c in zip(bs, cs)}
    specials = ["<pad>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for b in range(256):
        vocab[byte_chars[b]] = len(specials) + b
    return {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []},
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(20261121)
    write("sft.jsonl", [{"prompt": prompt(rng), "response": response(rng)} for _ in range(3000)])
    write("preferences.jsonl", preferences(rng, 3000))
    write("preferences_eval.jsonl", preferences(rng, 400))
    write("prompts.jsonl", [{"prompt": prompt(rng)} for _ in range(1000)])
    write("eval_prompts.jsonl", [{"prompt": prompt(rng)} for _ in range(64)])
    with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                   "pad_token": "<pad>"}, f)


if __name__ == "__main__":
    main()
