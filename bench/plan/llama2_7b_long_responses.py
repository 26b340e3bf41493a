#!/usr/bin/env python3
"""The planner's answer to the long-response question for the full
Llama-2-7B ReMax and PPO jobs on one 80 GB GPU (128 GiB host, 2 TiB NVMe,
the A100-80GB figures): for each place of the trained models' kept layer
inputs (`placement.activations`: device, host, nvme), the longest response
that fits, with the placement `strata plan --fit` picks for it. Prompts of
256 tokens, a batch of 8 prompts (micro-batches as the fit chooses, down to
one row), clipping off so that stepping in backward is allowed, PPO with one
epoch and one minibatch. Each point is one `strata plan --fit --json` call;
the length is searched in steps of 256 tokens, up to 128k (Llama-2's
4,096 positions stretched 32 times: beyond any RoPE scaling in use).

  bench/plan/llama2_7b_long_responses.py [--strata build/strata]
"""
import argparse
import json
import os
import subprocess

import llama2_7b_answers as answers  # beside this file: its placement summary

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIT = "device=80GiB,host=128GiB,nvme=2TiB"
FIGURES = "examples/figures/a100-80gb.json"
FIXED = ["data.max_prompt_tokens=256", "train.batch_size=8", "train.max_grad_norm=0", "ppo.epochs=1",
         "ppo.minibatches=1"]
STEP = 256
CAP = 1 << 17


def plan(strata, algorithm, activations, response):
    cmd = [strata, "plan", f"examples/llama2-7b/{algorithm}.yaml", "--fit", FIT, "--figures", FIGURES, "--json",
           "--fixed-activations"]
    sets = FIXED + [f"generation.max_new_tokens={response}", f"models.actor.placement.activations={activations}"]
    if algorithm == "ppo":
        sets.append(f"models.critic.placement.activations={activations}")
    for s in sets:
        cmd += ["--set", s]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO).stdout)[0]


def longest(strata, algorithm, activations):
    """The longest response that fits, or CAP when even that does."""
    if plan(strata, algorithm, activations, CAP)["fits"]:
        return CAP
    lo, hi = 0, CAP  # lo fits (0: nothing does), hi does not
    while hi - lo > STEP:
        mid = (lo + hi) // 2 // STEP * STEP
        if mid <= lo:
            break
        if plan(strata, algorithm, activations, mid)["fits"]:
            lo = mid
        else:
            hi = mid
    return lo


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=os.path.join(REPO, "build/strata"))
    args = ap.parse_args()
    print("| algorithm | activations | longest response that fits (tokens) | the fit's placement there |")
    print("| --- | --- | --- | --- |")
    for algorithm in ("remax", "ppo"):
        for activations in ("device", "host", "nvme"):
            best = longest(args.strata, algorithm, activations)
            where = answers.describe(plan(args.strata, algorithm, activations, best)) if best else "nothing fits"
            shown = f"{best} or more" if best == CAP else str(best)
            print(f"| {algorithm} | {activations} | {shown} | {where} |")


if __name__ == "__main__":
    main()
