"""Heavier sims tests (long Monte Carlo sweeps, full experiments): `pytest -m slow`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from grpo_theory import gram_clustered
from sims import checks
from sims.bandit import SoftmaxBandit
from sims.exact import ESTIMATOR_SPECS
from sims.experiments import EXPERIMENTS
from sims.multiturn import MultiTurnMDP
from sims.psi_models import clustered_psi, common_component_psi
from sims.token_mdp import TokenMDP


def test_clustered_scores_without_noise_have_the_exact_centre_gram() -> None:
    lab = np.array([1, 0, 1, 1, 0])
    P = clustered_psi(lab, d=64, rng=np.random.default_rng(0), within=2.0, between=0.5, noise=0.0)
    np.testing.assert_allclose(P @ P.T, gram_clustered(lab, within=2.0, between=0.5), atol=1e-12)


def test_common_component_gram_mean_within_4se() -> None:
    rng = np.random.default_rng(1)
    Ks = np.stack(
        [
            (lambda P: P @ P.T)(common_component_psi(4, d=256, rng=rng, strength=3.0))
            for _ in range(400)
        ]
    )
    mean, se = Ks.mean(0), Ks.std(0, ddof=1) / np.sqrt(Ks.shape[0])
    target = 3.0 * np.ones((4, 4)) + np.eye(4)
    assert np.all(np.abs(mean - target) <= 4 * se + 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("R", [2, 8, 16])
def test_theorem41_all_estimators_large_sample(R: int) -> None:
    b = SoftmaxBandit(np.array([0.2, -0.3, 0.0]), np.array([0.15, 0.55, 0.35]))
    rng = np.random.default_rng(R)
    for e in ESTIMATOR_SPECS:
        res = checks.check_theorem41(b, e, R=R, n_groups=200_000, rng=rng, eps_values=(0.1, 0.3))
        assert all(r.passed for r in res), [r.name for r in res if not r.passed]


@pytest.mark.slow
@pytest.mark.parametrize("R", [2, 8, 16])
def test_unbiasedness_all_estimators_token_mdp_large_sample(R: int) -> None:
    m = TokenMDP.random(np.random.default_rng(2), vocab=3, length=4)
    rng = np.random.default_rng(3)
    for e in ESTIMATOR_SPECS:
        res = checks.check_unbiasedness(m, e, R=R, n_groups=100_000, rng=rng)
        assert all(r.passed for r in res), [r.name for r in res if not r.passed]


@pytest.mark.slow
def test_multiturn_h4_r8_checks() -> None:
    m = MultiTurnMDP.random(np.random.default_rng(4), H=4, S=3, A=2)
    rng = np.random.default_rng(5)
    for e in ("grpo", "rloo", "grpo_std"):
        res = checks.check_multiturn(m, e, R=8, n=100_000, rng=rng)
        assert all(r.passed for r in res), [r.name for r in res if not r.passed]


# The CI-affordable subset of "every experiment, full size, exits 0 at seeds 0-4": every
# experiment at seed 0 (where moments/unbiasedness used to fail on grpo_passk's rare signal
# groups), and seeds 1-4 of the two experiments that hold the rare-event cases and most of the
# checks (moments, unbiasedness). All six at seeds 0-4 were run as docs/sims.md records.
FULL_RUNS = [(name, 0) for name in sorted(EXPERIMENTS)] + [
    (name, seed) for name in ("moments", "unbiasedness") for seed in (1, 2, 3, 4)]


@pytest.mark.slow
@pytest.mark.parametrize("name,seed", FULL_RUNS)
def test_full_experiment_exits_0_with_every_check_passed(
    name: str, seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`grpo-audit sims NAME --out DIR --seed SEED` at full size (no --quick) exits 0."""
    from grpo_audit.cli import main

    code = main(["sims", name, "--out", str(tmp_path), "--seed", str(seed)])
    res = json.loads((tmp_path / "results.json").read_text())
    failed = [(c["name"], c["z"], c["details"].get("rule")) for c in res["checks"]
              if not c["passed"]]
    assert code == 0 and not failed, (capsys.readouterr().err, failed)
    assert (tmp_path / "figure.png").exists() and res["n_checks"] >= 1 and not res["quick"]
