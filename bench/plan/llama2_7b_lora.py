#!/usr/bin/env python3
"""The planner's Llama-2-7B answers with LoRA beside full-parameter training:
the smallest single GPU that fits ReMax and PPO with little host memory
(32 GiB, no NVMe) and with room to offload (128 GiB host, 2 TiB NVMe), and
what one 80 GiB GPU (the ReMax repository's A100-80GB) does, at the ReMax
repository's batch sizes and DeepSpeed-Chat's 256 + 256 tokens (as
llama2_7b_answers.py), micro-batches allowed. LoRA is rank 16 on every
projection of the actor (and of PPO's critic); the reference is then the
actor's own base. Each answer is `strata plan --fit --json` calls.

  bench/plan/llama2_7b_lora.py [--strata build/strata]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama2_7b_answers import describe  # noqa: E402  (one way to print a fit)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = "examples/figures/a100-80gb.json"
GPUS = [16, 24, 32, 40, 48, 64, 80, 94, 141]  # GiB: common cards, H200 last
HOSTS = [("32 GiB host, no NVMe", "host=32GiB"), ("128 GiB host, 2 TiB NVMe", "host=128GiB,nvme=2TiB")]
BATCH = {"ppo": 32, "remax": 42}
COMMON = ["data.max_prompt_tokens=256", "generation.max_new_tokens=256", "train.max_grad_norm=0", "ppo.epochs=1",
          "ppo.minibatches=1"]
LORA = {"remax": ["models.actor.lora={rank: 16}"],
        "ppo": ["models.actor.lora={rank: 16}", "models.critic.lora={rank: 16}"]}


def plan(strata, algorithm, fit, overrides):
    cmd = [strata, "plan", f"examples/llama2-7b/{algorithm}.yaml", "--fit", fit, "--figures", FIGURES, "--json"]
    for o in COMMON + [f"train.batch_size={BATCH[algorithm]}"] + overrides:
        cmd += ["--set", o]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO).stdout)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=os.path.join(REPO, "build/strata"))
    args = ap.parse_args()
    print("| algorithm | training | host | smallest GPU that fits | what the planner chose there |")
    print("| --- | --- | --- | --- | --- |")
    for algorithm in ("remax", "ppo"):
        for training, overrides in (("full", []), ("LoRA r16", LORA[algorithm])):
            for host_label, host in HOSTS:
                found = None
                for gib in GPUS:
                    j = plan(args.strata, algorithm, f"device={gib}GiB,{host}", overrides)
                    if j["fits"]:
                        found = (gib, j)
                        break
                if found is None:
                    print(f"| {algorithm} | {training} | {host_label} | none up to {GPUS[-1]} GiB "
                          f"({j['binding_tier']} binds) | |")
                else:
                    print(f"| {algorithm} | {training} | {host_label} | {found[0]} GiB | {describe(found[1])} |")
                if found is not None and found[0] < 80:
                    j = plan(args.strata, algorithm, f"device=80GiB,{host}", overrides)
                    at80 = describe(j) if j["fits"] else f"does not fit ({j['binding_tier']} binds)"
                    print(f"| {algorithm} | {training} | {host_label} | (at 80 GiB) | {at80} |")


if __name__ == "__main__":
    main()
