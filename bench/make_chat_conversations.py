#!/usr/bin/env python3
"""Writes N synthetic chat conversations as JSONL, one {"messages": [...]} a
line: a system prompt, then 1 to 3 user/assistant pairs, each message 20 to
400 characters (system prompts half the time a short fixed one) of words
drawn from English, accented Latin, Greek, Cyrillic, Hebrew, Arabic, CJK and
emoji (about one word in six non-ASCII). The same N and seed give the same file.
The input of the chat-template benchmark (bench/chat_template_peer.mjs is
its peer side).

  bench/make_chat_conversations.py OUT.jsonl N [--seed 20261127]
"""

import argparse
import json
import random
import sys

ASCII_WORDS = (
    "the model answers each question with a short and careful explanation of what it knows about "
    "training data tokens batches gradients rewards policies values and the steps that follow from them "
    "please summarize this paragraph in two sentences then list three examples"
).split()
UNICODE_WORDS = [
    "café", "naïve", "Zürich", "façade", "jalapeño", "Ångström", "résumé", "Straße", "coöperate",
    "你好", "世界", "模型", "训练", "日本語", "テキスト", "한국어", "문장",
    "👋", "🚀", "👨‍👩‍👧‍👦", "🇯🇵", "❤️", "e\u0301", "𝕏", "Ωμέγα", "привет", "שלום", "مرحبا",
]
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a terse assistant: answer in one sentence.",
    "Tu es un assistant serviable qui répond en français.",
    "你是一个乐于助人的助手。",
]


def message_text(rng):
    """Words up to a length drawn from 20 to 400 characters, cut there (a
    trailing space dropped)."""
    target = rng.randint(20, 400)
    words = []
    size = -1
    while size < target:
        word = rng.choice(UNICODE_WORDS) if rng.random() < 1 / 6 else rng.choice(ASCII_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:target].rstrip()


def conversation(rng):
    system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.5 else message_text(rng)
    messages = [{"role": "system", "content": system}]
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": message_text(rng)})
        messages.append({"role": "assistant", "content": message_text(rng)})
    return {"messages": messages}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSONL file to write")
    parser.add_argument("n", type=int, help="how many conversations")
    parser.add_argument("--seed", type=int, default=20261127)
    args = parser.parse_args()
    if args.n < 0:
        parser.error("N must be >= 0")
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8") as f:
        for _ in range(args.n):
            f.write(json.dumps(conversation(rng), ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
