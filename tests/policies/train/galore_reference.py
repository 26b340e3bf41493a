#!/usr/bin/env python3
"""Independent reference for GaLore's optimizer step (Zhao et al. 2024,
Algorithm 2, "GaLore with Adam"), written from the paper in plain torch.

Usage: galore_reference.py IN.json OUT.json

IN.json holds one weight matrix W0 ([m, n]), the gradient of each step, the
projection P in effect at each step (given, so both sides project alike),
which side is projected, and the hyperparameters. Per step t (from 1):
  R = P^T G (rows projected) or G P (columns projected)
  M = b1 M + (1 - b1) R;  V = b2 V + (1 - b2) R*R
  N = (M / (1 - b1^t)) / (sqrt(V) / sqrt(1 - b2^t) + eps)   (torch's Adam)
  G~ = scale * (P N  or  N P^T)
  W = W (1 - lr wd) - lr G~                                  (AdamW's decay)
OUT.json: the final W and both moments.
"""
import json
import math
import sys

import torch


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    w = torch.tensor(spec["w0"], dtype=torch.float32)
    lr, wd = spec["lr"], spec["weight_decay"]
    b1, b2, eps, scale = spec["beta1"], spec["beta2"], spec["eps"], spec["scale"]
    rows = spec["projects_rows"]
    m = v = None
    for t, (g, p) in enumerate(zip(spec["grads"], spec["projections"]), start=1):
        g = torch.tensor(g, dtype=torch.float32)
        p = torch.tensor(p, dtype=torch.float32)
        r = p.T @ g if rows else g @ p
        if m is None:
            m, v = torch.zeros_like(r), torch.zeros_like(r)
        m = b1 * m + (1 - b1) * r
        v = b2 * v + (1 - b2) * r * r
        n = (m / (1 - b1 ** t)) / (v.sqrt() / math.sqrt(1 - b2 ** t) + eps)
        back = scale * (p @ n if rows else n @ p.T)
        w = w * (1 - lr * wd) - lr * back
    with open(sys.argv[2], "w") as f:
        json.dump({"w": w.tolist(), "exp_avg": m.tolist(), "exp_avg_sq": v.tolist()}, f)


if __name__ == "__main__":
    main()
