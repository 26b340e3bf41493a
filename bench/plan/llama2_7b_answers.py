#!/usr/bin/env python3
"""The planner's answers for the full Llama-2-7B ReMax and PPO jobs on three
hardware settings, at the ReMax repository's batch sizes and at the largest
batch that fits (docs/REMAX_VS_PPO.md). Prompt and response lengths are
DeepSpeed-Chat's defaults (256 + 256 tokens), which the ReMax repository
builds on, as are PPO's 1 epoch and 1 minibatch per batch; batches are
not split into micro-batches (the repository's batch sizes are what fit
without accumulation). Each answer is one `strata plan --fit --json` call.

  bench/plan/llama2_7b_answers.py [--strata build/strata]
"""
import argparse
import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTINGS = [
    ("(a) 1 x 80 GB GPU, 128 GiB host, 2 TiB NVMe", "device=80GiB,host=128GiB,nvme=2TiB", 1,
     "examples/figures/a100-80gb.json"),
    ("(b) 4 x A100-80GB, no offload (16 GiB host per rank)", "device=80GiB,host=16GiB", 4,
     "examples/figures/a100-80gb.json"),
    ("(b') 4 x A100-80GB, offload allowed (256 GiB host, 2 TiB NVMe per rank)", "device=80GiB,host=256GiB,nvme=2TiB", 4,
     "examples/figures/a100-80gb.json"),
    ("(c) this machine: CPU device, 24 GiB RAM, 60 GB free disk", "device=cpu,host=24GiB,nvme=60GB", 1,
     "examples/figures/dev-2vcpu.json"),
]
REPO_BATCH = {"ppo": 32, "remax": 42}
SEARCH_LIMIT = 1024  # the largest batch tried
LENGTHS = ["data.max_prompt_tokens=256", "generation.max_new_tokens=256", "train.max_grad_norm=0",
           "train.micro_batch_size=0", "ppo.epochs=1", "ppo.minibatches=1"]


def plan(strata, spec, fit, workers, figures, batch):
    cmd = [strata, "plan", spec, "--fit", fit, "--workers", str(workers), "--figures", figures, "--json",
           "--fixed-micro-batch"]
    for o in LENGTHS + [f"train.batch_size={batch}"]:
        cmd += ["--set", o]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO).stdout)[0]


def largest_batch(strata, spec, fit, workers, figures, step):
    """Binary search over multiples of `step` (ranks; PPO's 2 minibatches)."""
    lo, hi = 0, SEARCH_LIMIT  # lo fits (0: nothing does), hi does not
    if plan(strata, spec, fit, workers, figures, hi)["fits"]:
        return hi
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        if plan(strata, spec, fit, workers, figures, mid)["fits"]:
            lo = mid
        else:
            hi = mid
    return lo


def describe(j):
    if not j["fits"]:
        return f"does not fit: {j['binding_tier']} binds"
    parts = []
    for role, p in sorted(j["placement"].items()):
        s = f"{role} {p['weights']}"
        if p["trainable"]:
            s += f"/{p['optimizer']}" + (" step-in-backward" if p["step_in_backward"] else "")
        parts.append(s)
    for role, owner in sorted(j.get("shares_base_of", {}).items()):
        parts.append(f"{role} = {owner}'s base")
    micro = j["micro_batch_size"] or "whole"
    peak = j["peak_bytes"]
    return (f"{', '.join(parts)}; micro-batch {micro}; device {peak['device'] / 2**30:.1f} GiB, "
            f"RSS {j['process_rss_bytes'] / 2**30:.1f} GiB, NVMe {peak['nvme'] / 2**30:.1f} GiB; "
            f"{j['iteration_s']:.1f} s/iteration" +
            "".join(f"; GaLore r{r} on the {role}" for role, r in sorted(j.get("galore_rank", {}).items())))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=os.path.join(REPO, "build/strata"))
    args = ap.parse_args()
    print("| setting | algorithm | at the repo's batch | largest batch that fits | hours per epoch (45k prompts) at it |")
    print("| --- | --- | --- | --- | --- |")
    for label, fit, workers, figures in SETTINGS:
        for algorithm in ("ppo", "remax"):
            spec = f"examples/llama2-7b/{algorithm}.yaml"
            step = workers
            batch = REPO_BATCH[algorithm]
            at_repo = plan(args.strata, spec, fit, workers, figures, max(batch // step * step, step))
            best = largest_batch(args.strata, spec, fit, workers, figures, step)
            hours = ""
            if best:
                j = plan(args.strata, spec, fit, workers, figures, best)
                hours = f"{45000 / best * j['iteration_s'] / 3600:.1f} h at batch {best} ({describe(j)})"
            largest = "none" if not best else f"{best} or more" if best == SEARCH_LIMIT else str(best)
            print(f"| {label} | {algorithm} | batch {batch}: {describe(at_repo)} | {largest} | {hours} |")


if __name__ == "__main__":
    main()
