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
  groups): ``pass_gram_s``, ``pass_diagnostics_s``, ``pass_share``;
* with ``--trl-steps N`` (> 0): ``N`` measured TRL steps of the tiny float64 Llama of the tests
  (``tests/trl_geometry_helpers.py``), every step measured (second pass), timing the
  diagnostics as they run live (each process's sums, :func:`.step.local_diagnostic_sums`, and
  the final scalars, :func:`..protocol.step_diagnostics_fields`) against the whole optimizer step
  (TRL's step with its geometry): ``trl_step_s``, ``trl_diagnostics_s`` (medians over the steps
  after the first) and ``trl_share``. The diagnostics' cost depends on ``n`` and ``R`` only, a
  step's on the model: the tiny model's share is an upper bound for real models.

Timings depend on the machine and its load; re-measure on a quiet one before quoting them.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np
from ratios import best_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=64, help="groups (prompts) per step, n")
    ap.add_argument("--group-size", type=int, default=8, help="rollouts per group, R")
    ap.add_argument("--dim", type=int, default=2**18, help="parameters per row, d")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trl-steps", type=int, default=0, help="also time the live diagnostics "
                    "over this many measured TRL steps of the tiny model (0: no)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()
    if min(args.groups, args.group_size, args.dim, args.repeats) < 1:
        raise SystemExit("--groups, --group-size, --dim and --repeats must be >= 1")
    if args.trl_steps < 0:
        raise SystemExit("--trl-steps must be >= 0")

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
    if args.trl_steps:
        out.update(trl_share(args.trl_steps))
        print(f"TRL, tiny model, {args.trl_steps} measured steps: step "
              f"{out['trl_step_s'] * 1e3:9.1f} ms, live diagnostics "
              f"{out['trl_diagnostics_s'] * 1e3:7.3f} ms: share {100 * out['trl_share']:.3f} % "
              "(median over steps after the first)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


def trl_share(steps: int) -> dict[str, float]:
    """Median seconds of a measured TRL step of the tiny model and of its live diagnostics."""
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from transformers import TrainerCallback
    from trl_geometry_helpers import make_trainer  # the tests' tiny float64 model

    from real_model.integrations.trl import meter, step

    spent: list[float] = []

    def timed(fn: Callable) -> Callable:
        def run(*a: object, **k: object) -> object:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent.append(time.perf_counter() - t)
        return run

    per_step: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        t0 = 0.0

        def on_step_begin(self, args: object, state: object, control: object, **kw: object):
            spent.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, args: object, state: object, control: object, **kw: object):
            per_step.append((time.perf_counter() - self.t0, sum(spent)))

    real_sums, real_fields = step.local_diagnostic_sums, meter.step_diagnostics_fields
    step.local_diagnostic_sums = timed(real_sums)
    meter.step_diagnostics_fields = timed(real_fields)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tr = make_trainer(Path(tmp), max_steps=steps, callbacks=[Clock()],
                              per_device_train_batch_size=8, gradient_accumulation_steps=2)
            tr.train()
    finally:
        step.local_diagnostic_sums, meter.step_diagnostics_fields = real_sums, real_fields
    rest = per_step[1:] or per_step
    step_s = float(np.median([a for a, _ in rest]))
    diag_s = float(np.median([b for _, b in rest]))
    return {"trl_steps": steps, "trl_step_s": step_s, "trl_diagnostics_s": diag_s,
            "trl_share": diag_s / step_s}


if __name__ == "__main__":
    main()
