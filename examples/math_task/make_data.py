#!/usr/bin/env python3
"""Writes the math task's data (stdlib only, deterministic): arithmetic word
problems whose answers a verifier can check, as chat conversations.

    python3 examples/math_task/make_data.py [OUT_DIR]    (default examples/math_task/data)

Each problem is one of a few templates (a name, an object, one or two of
+ - *) over small numbers; its worked solution writes each step as an
equation and ends with the line `#### N`:

    Mia has 7 apples and buys 5 more. How many apples does she have now?
    7 + 5 = 12
    #### 12

Files (one JSON object a line):
  sft.jsonl       {"messages": [user problem, assistant solution]}
  prompts.jsonl   {"messages": [user problem], "answer": "12"}   RL prompts
  heldout.jsonl   the same form, for evaluation
No problem text appears twice, within a file or across them.
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 31
COUNTS = {"sft": 4000, "prompts": 2000, "heldout": 500}
# The SFT solutions come from a careless teacher: this fraction of them has
# an arithmetic slip (a step's result off by 1 or 2, carried to the final
# answer). The SFT model learns the slips along with the skill; a verifier's
# reward can teach it what imitation cannot.
SLIP_RATE = 0.3

# Operand ranges: what sets the difficulty. Every answer is a non-negative
# integer of at most three digits.
ADD_MAX = 9      # a + b with a, b in [1, ADD_MAX]
MUL_MAX = 5       # a * b with a, b in [2, MUL_MAX]
TWO_STEP_MAX = 9  # a + b - c with each in [1, TWO_STEP_MAX]

NAMES = [("Mia", "she"), ("Leo", "he"), ("Ava", "she"), ("Sam", "he"), ("Zoe", "she"), ("Ben", "he"),
         ("Ivy", "she"), ("Max", "he"), ("Lily", "she"), ("Omar", "he"), ("Nora", "she"), ("Raj", "he"),
         ("Emma", "she"), ("Noah", "he"), ("Sofia", "she"), ("Liam", "he")]
OBJECTS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "coins", "stamps", "shells", "cards",
           "balloons", "eggs", "flowers", "toys", "candies", "rocks"]


def add(rng, name, pron, obj):
    a, b = rng.randint(1, ADD_MAX), rng.randint(1, ADD_MAX)
    text = rng.choice([
        f"{name} has {a} {obj} and buys {b} more. How many {obj} does {pron} have now?",
        f"{name} had {a} {obj} and got {b} more. How many {obj} does {pron} have?",
        f"A box holds {a} {obj}. {name} adds {b}. How many {obj} are in the box?",
    ])
    return text, [(a, "+", b, a + b)]


def sub(rng, name, pron, obj):
    a = rng.randint(2, ADD_MAX)
    b = rng.randint(1, a - 1)
    text = rng.choice([
        f"{name} has {a} {obj} and gives away {b}. How many {obj} are left?",
        f"{name} had {a} {obj} and lost {b}. How many {obj} does {pron} have now?",
        f"A box holds {a} {obj}. {name} takes {b}. How many {obj} are in the box?",
    ])
    return text, [(a, "-", b, a - b)]


def mul(rng, name, pron, obj):
    a, b = rng.randint(2, MUL_MAX), rng.randint(2, MUL_MAX)
    text = rng.choice([
        f"{name} buys {a} bags of {b} {obj}. How many {obj} does {pron} buy?",
        f"{name} has {a} boxes with {b} {obj} each. How many {obj} is that?",
    ])
    return text, [(a, "*", b, a * b)]


def two_step(rng, name, pron, obj):
    a, b = rng.randint(1, TWO_STEP_MAX), rng.randint(1, TWO_STEP_MAX)
    c = rng.randint(1, a + b - 1)
    text = f"{name} has {a} {obj}, buys {b} more and gives away {c}. How many {obj} are left?"
    return text, [(a, "+", b, a + b), (a + b, "-", c, a + b - c)]


TEMPLATES = [add, add, sub, sub, mul, two_step]


def problem(rng):
    name, pron = rng.choice(NAMES)
    return rng.choice(TEMPLATES)(rng, name, pron, rng.choice(OBJECTS))


def with_slip(rng, steps):
    """The steps as a careless teacher writes them: one step's result off by
    1 or 2, carried into the steps after it (the result stays >= 0)."""
    k = rng.randrange(len(steps))
    slipped, carry = [], None
    for i, (x, op, y, z) in enumerate(steps):
        if carry is not None:
            x = carry
            z = x + y if op == "+" else x - y if op == "-" else x * y
        if i == k:
            z = max(0, z + rng.choice([-2, -1, 1, 2]))
            if z == steps[i][3]:
                z += 1
        slipped.append((x, op, y, z))
        carry = z
    return slipped


def solution(steps):
    lines = [f"{x} {op} {y} = {z}" for x, op, y, z in steps]
    return "\n".join(lines) + f"\n#### {steps[-1][3]}"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "data")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(SEED)
    seen = set()
    files = {}
    # Held-out first, so its size never depends on how many training rows are asked for.
    for split in ("heldout", "prompts", "sft"):
        rows = []
        while len(rows) < COUNTS[split]:
            text, steps = problem(rng)
            if text in seen:
                continue
            seen.add(text)
            user = {"role": "user", "content": text}
            if split == "sft":
                if rng.random() < SLIP_RATE:
                    steps = with_slip(rng, steps)
                rows.append({"messages": [user, {"role": "assistant", "content": solution(steps)}]})
            else:
                rows.append({"messages": [user], "answer": str(steps[-1][3])})
        files[split] = rows
    texts = [r["messages"][0]["content"] for rows in files.values() for r in rows]
    assert len(texts) == len(set(texts)), "a problem text repeats across files"
    for split, rows in files.items():
        with open(os.path.join(out, split + ".jsonl"), "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"{split}.jsonl: {len(rows)} problems")


if __name__ == "__main__":
    main()
