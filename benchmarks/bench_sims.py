"""Benchmark of sims (one CPU core): sampling throughput and exact-vs-sampled check time.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_sims.py [--json OUT.json]``. Prints, from one run:

* bandit sampling: groups/s and rewards/s of ``SoftmaxBandit.sample`` (float64) and
  ``sample_bernoulli_fast`` (float32 uniforms), K = 4 arms, R = 16, 2^20 groups per call
  (target: >= 1e7 sampled rewards per second);
* moment checks: groups/s of sample + GRPO advantages + Var/Cov statistics;
* the wall time of the exact-vs-sampled agreement checks (Thm 4.1 for all 8 estimators, R = 8,
  1e5 groups each; unbiasedness for grpo/rloo/grpo_std in bandit + token MDP) and their verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from ratios import best_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from grpo_io import environment
    from grpo_theory import compute_advantages
    from sims._stats import var_cov_stats
    from sims.bandit import SoftmaxBandit
    from sims.checks import check_theorem41, check_unbiasedness
    from sims.exact import ESTIMATOR_SPECS
    from sims.token_mdp import TokenMDP

    rng = np.random.default_rng(args.seed)
    b = SoftmaxBandit(np.array([0.0, 0.5, -0.5, 1.0]), np.array([0.2, 0.5, 0.7, 0.9]))
    n, R = 2**20, 16
    out: dict[str, object] = {
        **environment(libraries=("numpy",), device="cpu"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "seed": args.seed,
    }
    t64 = best_of(lambda: b.sample(n, R, rng))
    t32 = best_of(lambda: b.sample_bernoulli_fast(n, R, rng))
    out["bandit_sample_float64"] = {"groups_per_s": n / t64, "rewards_per_s": n * R / t64}
    out["bandit_sample_fast_float32"] = {"groups_per_s": n / t32, "rewards_per_s": n * R / t32}

    nm, Rm = 2**18, 8

    def moments() -> None:
        _, r = b.sample(nm, Rm, rng)
        A = np.asarray(compute_advantages("grpo", r))
        var_cov_stats(A)

    tm = best_of(moments)
    out["moment_pipeline_R8"] = {"groups_per_s": nm / tm, "rewards_per_s": nm * Rm / tm}

    t = time.perf_counter()
    res = []
    for e in ESTIMATOR_SPECS:
        res += check_theorem41(b, e, R=8, n_groups=100_000, rng=rng, eps_values=(0.2,))
    t_thm = time.perf_counter() - t
    mdp = TokenMDP.random(np.random.default_rng(1))
    t = time.perf_counter()
    res_u = []
    for e in ("grpo", "rloo", "grpo_std"):
        res_u += check_unbiasedness(b, e, R=8, n_groups=100_000, rng=rng)
        res_u += check_unbiasedness(mdp, e, R=8, n_groups=100_000, rng=rng)
    t_unb = time.perf_counter() - t
    out["agreement_checks"] = {
        "thm41_all_estimators_R8_1e5_groups_s": t_thm,
        "thm41_n_checks": len(res),
        "thm41_n_passed": sum(r.passed for r in res),
        "unbiasedness_3_estimators_2_worlds_R8_1e5_groups_s": t_unb,
        "unbiasedness_n_checks": len(res_u),
        "unbiasedness_n_passed": sum(r.passed for r in res_u),
    }
    for key in ("bandit_sample_float64", "bandit_sample_fast_float32", "moment_pipeline_R8"):
        v = out[key]
        print(f"{key:28s} {v['groups_per_s']:12.4g} groups/s {v['rewards_per_s']:12.4g} rewards/s")
    a = out["agreement_checks"]
    print(
        "Thm 4.1 checks (8 estimators, R=8, 1e5 groups): "
        f"{a['thm41_all_estimators_R8_1e5_groups_s']:.2f} s, "
        f"{a['thm41_n_passed']}/{a['thm41_n_checks']} passed (k=4)"
    )
    print(
        f"unbiasedness checks (3 estimators x 2 worlds, R=8, 1e5 groups): "
        f"{a['unbiasedness_3_estimators_2_worlds_R8_1e5_groups_s']:.2f} s, "
        f"{a['unbiasedness_n_passed']}/{a['unbiasedness_n_checks']} passed (k=4)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
