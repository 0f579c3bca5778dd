"""Cost of a step's diagnostics (:func:`grpo_theory.diagnostics.step_diagnostics`) next to the
cost of the Grams they read.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_diagnostics.py [--groups 64] [--group-size 8]
[--dim 262144] [--json OUT.json]``. Prints, best of ``--repeats``:

* ``gram_s``: the per-group Grams ``K_g = G_g G_g^T`` of ``n`` groups of ``R`` materialised
  float32 rows of ``d`` parameters (``n R^2 d`` multiply-adds): the cheapest conceivable way to
  get them. The engine of ``real_model`` never materialises rows: its Grams cost at least a
  forward and backward of the model over the rollouts' tokens, far more than this for any real
  model, so the printed share is an upper bound for models with more than ``d`` parameters;
* ``diagnostics_s``: ``step_diagnostics`` on those Grams (tokens, rewards, the host's norm):
  every diagnostic but the pass cosines, float64; ``share = diagnostics_s / gram_s``;
* the same with the pass Gram of the whole step's rows (``(n R)^2 d``, for the cosines between
  groups): ``pass_gram_s``, ``pass_diagnostics_s``, ``pass_share``.

Timings depend on the machine and its load; re-measure on a quiet one before quoting them.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` wall times of ``fn()`` (seconds).

    >>> best_of(lambda: None, 2) >= 0.0
    True
    """
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=64, help="groups (prompts) per step, n")
    ap.add_argument("--group-size", type=int, default=8, help="rollouts per group, R")
    ap.add_argument("--dim", type=int, default=2**18, help="parameters per row, d")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()
    if min(args.groups, args.group_size, args.dim, args.repeats) < 1:
        raise SystemExit("--groups, --group-size, --dim and --repeats must be >= 1")

    from grpo_io import environment
    from grpo_theory.diagnostics import step_diagnostics

    n, R, d = args.groups, args.group_size, args.dim
    rng = np.random.default_rng(args.seed)
    rows = rng.standard_normal((n, R, d), dtype=np.float32)
    rows[: n // 4] = 0.0  # a quarter of the groups dead
    flat = rows.reshape(n * R, d)
    tokens = rng.integers(1, 512, size=(n, R))
    rewards = rng.integers(0, 2, size=(n, R)).astype(float)
    total = float(np.linalg.norm(flat.sum(axis=0, dtype=np.float64)))

    def grams() -> np.ndarray:
        return np.matmul(rows, rows.transpose(0, 2, 1))

    def pass_gram() -> np.ndarray:
        return flat @ flat.T

    K, KP = grams(), pass_gram()

    def diagnostics(with_pass: bool = False) -> dict[str, float]:
        return step_diagnostics(K, tokens=tokens, rewards=rewards, total_grad_norm=total,
                                pass_grams=[KP] if with_pass else ())

    gram_s = best_of(grams, args.repeats)
    diag_s = best_of(diagnostics, args.repeats)
    pass_s = gram_s + best_of(pass_gram, args.repeats)
    pass_diag_s = best_of(lambda: diagnostics(True), args.repeats)
    out = {
        **environment(libraries=("numpy",), device="cpu"),
        "groups": n, "group_size": R, "dim": d, "repeats": args.repeats,
        "gram_s": gram_s, "diagnostics_s": diag_s, "share": diag_s / gram_s,
        "pass_gram_s": pass_s, "pass_diagnostics_s": pass_diag_s,
        "pass_share": pass_diag_s / pass_s, "keys": len(diagnostics()),
    }
    print(f"n = {n} groups x R = {R} rollouts, d = {d} parameters (float32 rows); "
          f"{out['keys']} keys")
    print(f"per-group Grams {gram_s * 1e3:10.3f} ms, diagnostics {diag_s * 1e3:8.3f} ms: "
          f"share {100 * out['share']:.3f} %")
    print(f"+ the pass Gram {pass_s * 1e3:10.3f} ms, diagnostics {pass_diag_s * 1e3:8.3f} ms: "
          f"share {100 * out['pass_share']:.3f} %")
    print(f"(upper bounds for a model with more than {d} parameters; timings of this machine "
          "under its present load)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
