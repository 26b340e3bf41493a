#!/usr/bin/env python3
"""Checks `strata plan` against measurement: runs ReMax and PPO jobs under
several placements, reads the peaks per tier and phase and the phase times
each run reports, and compares them with what the planner predicts for the
same spec. Prints a markdown table (and JSON with --json-out).

  bench/plan/validate.py --shapes tiny,medium --figures FIGURES.json

--check exits 1 when a memory prediction misses by more than --memory-tolerance
(10%) or a time prediction by more than --time-tolerance (25%; 0 skips times,
as the CI test does: times are benchmarks, not assertions).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PHASES = ("rollout", "score", "update")
TIERS = ("device", "host", "nvme")
MIB = 1 << 20

# Model shapes: config, dtype, prompts, tokens.
SHAPES = {
    "tiny": dict(config="examples/tiny/model.json", dtype="fp32", batch=16, prompt=16, new=24, host_mib=512),
    "medium": dict(config="examples/medium/model.json", dtype="fp32", batch=8, prompt=16, new=24, host_mib=4096),
    # Llama-2-7B's per-layer sizes (hidden 4096, intermediate 11008, 32 heads,
    # vocabulary 32000) with two decoder layers.
    "7b-width": dict(config="examples/llama2-7b/config.json", layers=2, dtype="bf16", batch=2, prompt=16, new=8,
                     host_mib=16384,
                     # PPO's second trained model (the critic) puts two sets of
                     # Adam states past this machine's RAM: they go to NVMe.
                     ppo_extra=["models.actor.placement.optimizer=nvme", "models.critic.placement.optimizer=nvme"]),
}

# Placements: (label, overrides). Each is tried with ReMax and PPO.
PLACEMENTS = [
    ("resident", []),
    ("actor streamed from host", ["models.actor.placement.weights=host"]),
    ("actor Adam on NVMe, reference on NVMe",
     ["models.actor.placement.optimizer=nvme", "models.reference.placement.weights=nvme"]),
    ("actor on NVMe (prefetch 2) + Adam on NVMe, reward from host, micro-batch 1/2",
     ["models.actor.placement.weights=nvme", "models.actor.placement.prefetch=2",
      "models.actor.placement.optimizer=nvme", "models.reward.placement.weights=host", "MICRO_HALF"]),
]
PPO_EXTRA = {
    "actor Adam on NVMe, reference on NVMe": ["models.critic.placement.optimizer=nvme"],
    "actor on NVMe (prefetch 2) + Adam on NVMe, reward from host, micro-batch 1/2":
        ["models.critic.placement.weights=host", "models.critic.placement.optimizer=nvme"],
}


def run(cmd, **kw):
    result = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        sys.stderr.write(f"$ {' '.join(cmd)}\n{result.stdout[-2000:]}{result.stderr[-4000:]}\n")
        raise SystemExit(f"validate: command failed ({result.returncode}): {' '.join(cmd[:3])} ...")
    return result.stdout


def prepare_models(strata, work, name, shape):
    """Random-weight base and reward models of the shape (made once)."""
    base, reward = os.path.join(work, name, "base"), os.path.join(work, name, "reward")
    if os.path.exists(os.path.join(reward, "config.json")):
        return base, reward
    config = os.path.join(REPO, shape["config"])
    if "layers" in shape:
        with open(config) as f:
            c = json.load(f)
        c["num_hidden_layers"] = shape["layers"]
        c["max_position_embeddings"] = 256
        os.makedirs(os.path.join(work, name), exist_ok=True)
        config = os.path.join(work, name, "config.json")
        with open(config, "w") as f:
            json.dump(c, f)
    for out, head, seed in ((base, "lm", 1), (reward, "scalar", 2)):
        shutil.rmtree(out, ignore_errors=True)
        run([strata, "init-model", "--config", config, "--out", out, "--head", head, "--dtype", shape["dtype"],
             "--seed", str(seed)])
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(REPO, "examples/tiny/data", f), base)
    return base, reward


def write_spec(work, name, algorithm, shape, base, reward, nvme_dir):
    path = os.path.join(work, name, f"{algorithm}.yaml")
    dtype = shape["dtype"]
    critic = f"\n  critic: {{path: {reward}, dtype: {dtype}}}" if algorithm == "ppo" else ""
    with open(path, "w") as f:
        f.write(f"""algorithm: {algorithm}
models:
  actor: {{path: {base}, dtype: {dtype}}}
  reference: {{path: {base}, dtype: {dtype}}}
  reward: {{path: {reward}, dtype: {dtype}}}{critic}
data: {{train: {REPO}/examples/tiny/data/prompts.jsonl, max_prompt_tokens: {shape['prompt']}}}
train: {{iterations: 2, batch_size: {shape['batch']}, lr: 1.0e-6, seed: 3}}
generation: {{max_new_tokens: {shape['new']}}}
memory: {{host_mib: {shape['host_mib']}, nvme_dir: {nvme_dir}}}
output: {{dir: {work}/{name}/out-{algorithm}}}
""")
    return path


def measure_median(strata, spec, overrides, iterations, repeats):
    """The run whose iteration time is the median of `repeats` runs: this
    shared machine's speed moves between processes by up to 40% on the tiny
    shape (docs/REMAX_VS_PPO.md), which one run would take for a miss."""
    runs = sorted((measure(strata, spec, overrides, iterations) for _ in range(repeats)),
                  key=lambda m: m["iteration_s"])
    chosen = dict(runs[len(runs) // 2])
    chosen["iteration_s_runs"] = [m["iteration_s"] for m in runs]
    return chosen


def measure(strata, spec, overrides, iterations):
    sets = []
    for o in overrides + [f"train.iterations={iterations}"]:
        sets += ["--set", o]
    out_dir = None
    with open(spec) as f:
        for line in f:
            if line.startswith("output:"):
                out_dir = line.split("dir:")[1].strip().rstrip("}").strip()
    shutil.rmtree(out_dir, ignore_errors=True)
    run([strata, "train", spec] + sets)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    last = lines[-1]
    m = {"rss": last.get("memory/process_rss_peak_bytes", 0.0), "iteration_s": last["time/iteration_s"]}
    for p in PHASES:
        m[p] = {t: last.get(f"memory/{p}/{t}_peak_bytes", 0.0) for t in TIERS}
        m[p]["seconds"] = last.get(f"time/{p}_s", 0.0)
    return m


def predict(strata, spec, overrides, figures):
    sets = []
    for o in overrides:
        sets += ["--set", o]
    j = json.loads(run([strata, "plan", spec, "--json", "--figures", figures] + sets))[0]
    p = {"rss": j["process_rss_bytes"], "iteration_s": j["iteration_s"]}
    for ph in PHASES:
        phase = j["phases"][ph]
        p[ph] = dict(phase["peak_bytes"])
        p[ph]["seconds"] = phase["seconds"]
    return p


def error(predicted, measured, floor):
    return abs(predicted - measured) / max(measured, floor)


def summary(rows):
    """One line per run: the worst phase's error per tier, RSS, and time."""
    out = ["| shape | algorithm | placement | device | host | nvme | peak RSS pred / meas | s/iteration pred / meas |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        p, m = r["predicted"], r["measured"]
        cells = []
        for tier in TIERS:
            worst = max(PHASES, key=lambda ph: error(p[ph][tier], m[ph][tier], MIB))
            e = error(p[worst][tier], m[worst][tier], MIB)
            cells.append(f"{e:.1%} ({worst})" if m[worst][tier] > 0 or p[worst][tier] > 0 else "-")
        rss = f"{p['rss'] / MIB:.0f} / {m['rss'] / MIB:.0f} MiB ({error(p['rss'], m['rss'], MIB):.1%})"
        t = f"{p['iteration_s']:.2f} / {m['iteration_s']:.2f} ({error(p['iteration_s'], m['iteration_s'], 1e-3):.1%})"
        runs = m.get("iteration_s_runs", [])
        if len(runs) > 1:
            t += f" [runs {min(runs):.2f}-{max(runs):.2f}]"
        out.append(f"| {r['shape']} | {r['algorithm']} | {r['placement']} | " + " | ".join(cells) + f" | {rss} | {t} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=os.path.join(REPO, "build/strata"))
    ap.add_argument("--figures", required=True, help="`strata bench figures` output")
    ap.add_argument("--work", default="/tmp/strata-plan-validate")
    ap.add_argument("--shapes", default="tiny,medium")
    ap.add_argument("--algorithms", default="remax,ppo")
    ap.add_argument("--placements", default="", help="comma-separated indices into the placement list (default all)")
    ap.add_argument("--iterations", type=int, default=3, help="iterations per run; the last one is compared")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per row; the one with the median iteration time is compared")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--memory-tolerance", type=float, default=0.10)
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--time-tolerance", type=float, default=0.25)
    ap.add_argument("--json-out", default="")
    ap.add_argument("--summary-of", default="", help="print the summary of an earlier --json-out and exit")
    ap.add_argument("--repredict", default="",
                    help="an earlier --json-out: predict its runs again with this binary and --figures "
                         "(the measurements are kept; nothing runs), then print the summary")
    args = ap.parse_args()
    if args.summary_of:
        with open(args.summary_of) as f:
            print(summary(json.load(f)))
        return 0
    if args.repredict:
        with open(args.repredict) as f:
            rows = json.load(f)
        work = os.path.abspath(args.work)
        for r in rows:
            spec = os.path.join(work, r["shape"], f"{r['algorithm']}.yaml")
            r["predicted"] = predict(args.strata, spec, r["overrides"], args.figures)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(rows, f, indent=1)
        print(summary(rows))
        return 0

    work = os.path.abspath(args.work)
    nvme_dir = os.path.join(work, "nvme")
    os.makedirs(nvme_dir, exist_ok=True)
    chosen = [PLACEMENTS[int(i)] for i in args.placements.split(",")] if args.placements else PLACEMENTS
    rows, failures = [], []
    print("| shape | algorithm | placement | tier | rollout pred / meas | score pred / meas | update pred / meas | worst |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        base, reward = prepare_models(args.strata, work, name, shape)
        for algorithm in args.algorithms.split(","):
            spec = write_spec(work, name, algorithm, shape, base, reward, nvme_dir)
            for label, overrides in chosen:
                overrides = list(overrides) + (PPO_EXTRA.get(label, []) if algorithm == "ppo" else [])
                if algorithm == "ppo":
                    overrides = shape.get("ppo_extra", []) + overrides
                overrides = [f"train.micro_batch_size={max(1, shape['batch'] // 2)}" if o == "MICRO_HALF" else o
                             for o in overrides]
                m = measure_median(args.strata, spec, overrides, args.iterations, args.repeats)
                p = predict(args.strata, spec, overrides, args.figures)
                row = {"shape": name, "algorithm": algorithm, "placement": label, "overrides": overrides,
                       "measured": m, "predicted": p}
                rows.append(row)
                # Memory: every tier of every phase, and the process's peak RSS
                # (floor: 1 MiB, so an empty tier predicted empty is exact).
                for tier in TIERS:
                    cells, worst = [], 0.0
                    for ph in PHASES:
                        e = error(p[ph][tier], m[ph][tier], MIB)
                        worst = max(worst, e)
                        cells.append(f"{p[ph][tier] / MIB:.1f} / {m[ph][tier] / MIB:.1f} MiB")
                    print(f"| {name} | {algorithm} | {label} | {tier} | " + " | ".join(cells) + f" | {worst:.1%} |")
                    if worst > args.memory_tolerance:
                        failures.append(f"{name} {algorithm} [{label}] {tier}: {worst:.1%}")
                e = error(p["rss"], m["rss"], MIB)
                print(f"| {name} | {algorithm} | {label} | process RSS | | | "
                      f"{p['rss'] / MIB:.0f} / {m['rss'] / MIB:.0f} MiB | {e:.1%} |")
                if e > args.rss_tolerance:
                    failures.append(f"{name} {algorithm} [{label}] RSS: {e:.1%}")
                cells = [f"{p[ph]['seconds']:.3f} / {m[ph]['seconds']:.3f} s" for ph in PHASES]
                et = error(p["iteration_s"], m["iteration_s"], 1e-3)
                print(f"| {name} | {algorithm} | {label} | time | " + " | ".join(cells) +
                      f" | {p['iteration_s']:.3f} / {m['iteration_s']:.3f} s: {et:.1%} |")
                if args.time_tolerance > 0 and et > args.time_tolerance:
                    failures.append(f"{name} {algorithm} [{label}] time: {et:.1%}")
                sys.stdout.flush()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    print("\n" + summary(rows))
    if failures:
        print("\nmisses beyond tolerance:\n  " + "\n  ".join(failures))
    if args.check and failures:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
