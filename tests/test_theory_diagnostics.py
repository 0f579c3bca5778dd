"""``grpo_theory.diagnostics``: every diagnostic equals its definition on brute-force per-rollout
gradients of a tiny float64 torch model (rows by autograd, one backward per rollout; no Gram
engine), invariances as hypothesis properties, and the merge rule and the input checks."""

from __future__ import annotations

import math
from itertools import permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_theory import compute_advantages
from grpo_theory.aggregation import aggregation_weights
from grpo_theory.diagnostics import (
    MERGE_RULES,
    NOISE_STATUS,
    dead_groups,
    diagnostics_from_sums,
    diagnostics_notes,
    gradient_noise_scale,
    group_arrays,
    group_gradient_cosines,
    group_sums,
    merge_group_sums,
    noise_scale_parts,
    rollout_grad_norms,
    solve_rate_mass,
    step_diagnostics,
)

TOL = 1e-10


# --- the brute-force step: a tiny autoregressive policy in float64 ------------------------------
def _brute_step(seed: int = 2, n: int = 5, R: int = 4) -> dict:
    """Per-rollout gradient rows of a GRPO step (token-mean loss) by autograd, one backward per
    rollout, and the host's gradient by one backward of the whole loss."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(seed)
    V, D, T = 6, 3, 5
    emb = torch.randn(V, D, generator=g, dtype=torch.float64, requires_grad=True)
    head = torch.randn(D, V, generator=g, dtype=torch.float64, requires_grad=True)
    params = [emb, head]
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, size=(n, R, T))
    lengths = rng.integers(1, T + 1, size=(n, R))
    lengths[0, 1] = 0  # an empty completion: a zero row
    rewards = rng.integers(0, 2, size=(n, R)).astype(float)
    rewards[1] = 1.0  # all solved: a dead group under GRPO
    rewards[2] = 0.0  # none solved: dead
    rewards[3] = [1.0, 0.0, 0.0, 0.0]
    A = np.asarray(compute_advantages("grpo_std", rewards, eps=1e-4))
    w = aggregation_weights(lengths, mode="token_mean")

    def seq_logp(i: int, r: int) -> torch.Tensor:
        ids = torch.as_tensor(tokens[i, r])
        prev = torch.cat([torch.zeros(1, dtype=torch.long), ids[:-1]])
        logits = emb[prev] @ head
        lp = torch.log_softmax(logits, dim=-1).gather(1, ids[:, None])[:, 0]
        return lp[: int(lengths[i, r])].sum()

    def loss_of(i: int, r: int) -> torch.Tensor:
        return -float(w[i, r] * A[i, r]) * seq_logp(i, r)

    rows = np.zeros((n, R, sum(p.numel() for p in params)))
    for i in range(n):
        for r in range(R):
            grads = torch.autograd.grad(loss_of(i, r), params, allow_unused=True)
            rows[i, r] = torch.cat([gr.reshape(-1) for gr in grads]).numpy()
    total = sum(loss_of(i, r) for i in range(n) for r in range(R))
    host = torch.cat([gr.reshape(-1) for gr in torch.autograd.grad(total, params)]).numpy()
    return {"rows": rows, "host": host, "tokens": lengths, "rewards": rewards, "A": A}


@pytest.fixture(scope="module")
def step() -> dict:
    s = _brute_step()
    rows = s["rows"]
    s["grams"] = np.einsum("gid,gjd->gij", rows, rows)
    flat = rows.reshape(-1, rows.shape[-1])
    s["pass_gram"] = flat @ flat.T
    s["diag"] = step_diagnostics(s["grams"], tokens=s["tokens"], rewards=s["rewards"],
                                 total_grad_norm=float(np.linalg.norm(s["host"])),
                                 pass_grams=[s["pass_gram"]])
    return s


def _close(a: float, b: float) -> None:
    assert abs(a - b) <= TOL * max(1.0, abs(b)), (a, b)


def test_rows_sum_to_the_hosts_gradient(step: dict) -> None:
    np.testing.assert_allclose(step["rows"].sum(axis=(0, 1)), step["host"], rtol=0, atol=1e-14)


def test_rollout_and_group_norms_equal_the_norms_of_the_rows(step: dict) -> None:
    rows, d = step["rows"], step["diag"]
    norms = np.linalg.norm(rows, axis=-1)
    np.testing.assert_allclose(rollout_grad_norms(step["grams"]), norms, rtol=TOL, atol=TOL)
    G = rows.sum(axis=1)
    gn = np.linalg.norm(G, axis=-1)
    a = group_arrays(step["grams"], tokens=step["tokens"], rewards=step["rewards"])
    np.testing.assert_allclose(a["group_grad_norm"], gn, rtol=TOL, atol=TOL)
    _close(d["rollout_grad_norm/mean"], norms.mean())
    _close(d["rollout_grad_norm/rms"], math.sqrt((norms**2).mean()))
    _close(d["rollout_grad_norm/max"], norms.max())
    _close(d["group_grad_norm/mean"], gn.mean())
    _close(d["group_grad_norm/rms"], math.sqrt((gn**2).mean()))
    _close(d["group_grad_norm/max"], gn.max())
    _close(d["grad_norm"], float(np.linalg.norm(step["host"])))


def test_dead_groups_are_the_groups_whose_rows_are_all_exactly_zero(step: dict) -> None:
    rows, d, L = step["rows"], step["diag"], step["tokens"]
    zero = np.all(rows == 0.0, axis=(1, 2))
    assert zero.tolist() == [False, True, True, False, False]
    assert dead_groups(step["grams"]).tolist() == zero.tolist()
    assert d["dead_groups/count"] == zero.sum()
    _close(d["dead_groups/group_share"], zero.mean())
    _close(d["dead_groups/rollout_share"], zero.mean())
    _close(d["dead_groups/token_share"], L[zero].sum() / L.sum())
    # the empty completion's row is zero, yet its group is live
    assert np.all(rows[0, 1] == 0.0) and not zero[0]


def test_noise_scale_parts_equal_the_u_statistics_of_the_group_estimates(step: dict) -> None:
    rows, d = step["rows"], step["diag"]
    n = rows.shape[0]
    x = n * rows.sum(axis=1)  # each group's estimate of the step's gradient
    mu_sq = sum(x[g] @ x[h] for g in range(n) for h in range(n) if g != h) / (n * (n - 1))
    xbar = x.mean(axis=0)
    trace = ((x - xbar) ** 2).sum() / (n - 1)
    _close(d["noise/mu_sq"], mu_sq)
    _close(d["noise/trace_sigma"], trace)
    _close(d["noise/step_noise_sq"], trace / n)
    assert d["noise/status"] == 0.0
    _close(d["noise/b_simple"], trace / mu_sq)
    _close(d["noise/snr"], mu_sq / (trace / n))


def test_alignment_equals_the_cosines_of_the_group_gradients(step: dict) -> None:
    rows, d = step["rows"], step["diag"]
    G = rows.sum(axis=1)
    n = G.shape[0]
    norm = np.linalg.norm(G, axis=-1)
    pairs = [(g, h) for g in range(n) for h in range(g + 1, n) if norm[g] > 0 and norm[h] > 0]
    cos = [G[g] @ G[h] / (norm[g] * norm[h]) for g, h in pairs]
    assert d["alignment/pass_pairs"] == len(pairs)
    _close(d["alignment/pass_cos_mean"], float(np.mean(cos)))
    _close(d["alignment/pass_cos_min"], min(cos))
    _close(d["alignment/pass_cos_max"], max(cos))
    C = group_gradient_cosines(step["pass_gram"], group_size=rows.shape[1])
    for (g, h), c in zip(pairs, cos, strict=True):
        _close(C[g, h], c)
    assert np.isnan(C[1]).all()  # a dead group has no cosine
    num = sum(G[g] @ G[h] for g in range(n) for h in range(n) if g != h)
    den = sum(norm[g] * norm[h] for g in range(n) for h in range(n) if g != h)
    _close(d["alignment/weighted_cos"], num / den)


def test_mass_shares_are_the_group_energies_by_solve_rate(step: dict) -> None:
    rows, d, r = step["rows"], step["diag"], step["rewards"]
    sq = (rows.sum(axis=1) ** 2).sum(axis=-1)
    k = (r > 0.5).sum(axis=1)
    R = r.shape[1]
    for j in range(R + 1):
        _close(d[f"mass_share/solved_{j}_of_{R}"], sq[k == j].sum() / sq.sum())
    mass, count = solve_rate_mass(sq, r)
    assert count.tolist() == np.bincount(k, minlength=R + 1).tolist()
    np.testing.assert_allclose(mass, np.bincount(k, weights=sq, minlength=R + 1), rtol=TOL)
    # GRPO's dead groups are the all-or-nothing ones
    assert d[f"mass_share/solved_0_of_{R}"] == 0.0 and d[f"mass_share/solved_{R}_of_{R}"] == 0.0


# --- merge ----------------------------------------------------------------------------------------
def test_merging_the_sums_of_parts_gives_the_whole_step(step: dict) -> None:
    K, L, r = step["grams"], step["tokens"], step["rewards"]
    a, b = [0, 3], [1, 2, 4]  # groups 1 and 2 are dead
    flat = step["rows"][a].reshape(-1, step["rows"].shape[-1])
    parts = [group_sums(K[a], tokens=L[a], rewards=r[a], pass_grams=[flat @ flat.T]),
             group_sums(K[b], tokens=L[b], rewards=r[b])]
    merged = merge_group_sums(parts)
    whole = group_sums(K, tokens=L, rewards=r)
    for key in whole:
        if not key.startswith("pass_"):
            assert merged[key] == pytest.approx(whole[key], rel=1e-12, abs=0), key
    # pairs only within a pass: the first part's one pass of 2 live groups has 1 pair
    assert merged["pass_pairs"] == 1.0
    total = float(np.linalg.norm(step["host"]))
    d = diagnostics_from_sums(merged, total_grad_norm=total, num_groups=5)
    assert d["noise/mu_sq"] == pytest.approx(step["diag"]["noise/mu_sq"], rel=1e-12)
    with pytest.raises(ValueError, match="num_groups=6 but the sums hold 5 groups"):
        diagnostics_from_sums(merged, total_grad_norm=total, num_groups=6)


def test_merge_rules_cover_every_sum_key_and_refuse_unknown_keys() -> None:
    s = group_sums([np.eye(2)], tokens=[[1, 1]], rewards=[[1.0, 0.0]])
    assert set(s) == set(MERGE_RULES) | {f"{w}_solved_{k}_of_2" for w in ("mass", "groups")
                                          for k in range(3)}
    with pytest.raises(ValueError, match="unknown group-sums key 'bogus'"):
        merge_group_sums([{**s, "bogus": 1.0}])
    with pytest.raises(ValueError, match="at least one part"):
        merge_group_sums([])
    # groups of different sizes merge: each R keeps its own solve-rate keys
    t = group_sums([np.eye(3)], tokens=[[1, 1, 1]], rewards=[[1.0, 1.0, 0.0]])
    m = diagnostics_from_sums(merge_group_sums([s, t]), total_grad_norm=1.0)
    assert m["mass_share/solved_1_of_2"] == pytest.approx(2 / 5)
    assert m["mass_share/solved_2_of_3"] == pytest.approx(3 / 5)


# --- the noise scale's statuses -------------------------------------------------------------------
def test_every_noise_status_says_why_and_nothing_is_clamped() -> None:
    assert gradient_noise_scale(1.0, 1.0, num_groups=1).status == 1
    assert gradient_noise_scale(1.0, None, num_groups=3).status == 2
    ns = gradient_noise_scale(0.0, 0.0, num_groups=3)
    assert (ns.status, ns.mu_sq, ns.trace_sigma) == (3, 0.0, 0.0) and math.isnan(ns.b_simple)
    ns = gradient_noise_scale(3.0, 1.0, num_groups=3)  # groups cancel: |mu|^2_hat < 0
    assert ns.status == 4 and ns.mu_sq == pytest.approx(-3.0) and math.isnan(ns.b_simple)
    assert ns.snr == pytest.approx(-3.0 / (12.0 / 3))
    ns = gradient_noise_scale(1.0, 9.0, num_groups=3)  # |G|^2 = 9 > n sum = 3: impossible
    assert ns.status == 5 and ns.trace_sigma == pytest.approx(-9.0) and math.isnan(ns.snr)
    assert ns.reason == NOISE_STATUS[5]
    ns = gradient_noise_scale(3.0, 4.0, num_groups=3)
    assert (ns.status, ns.b_simple, ns.snr) == (0, pytest.approx(5.0), pytest.approx(0.6))
    # at the inputs' precision an estimate of 1e-9 relative is not resolved from 0
    assert gradient_noise_scale(1.0, 1.0 + 1e-9, num_groups=2).status == 4
    assert gradient_noise_scale(1.0, 1.0 + 1e-9, num_groups=2, rtol=1e-12).status == 0
    d = step_diagnostics([np.eye(2)], tokens=[[1, 1]], rewards=[[1, 0]], total_grad_norm=1.0)
    notes = diagnostics_notes(d)
    assert any("fewer than 2 groups" in x for x in notes)
    assert any("no pair of live groups" in x for x in notes)


def test_noise_scale_parts_broadcast_over_arrays() -> None:
    mu, tr = noise_scale_parts(np.array([2.0, 3.0]), np.array([4.0, 4.0]), num_groups=2)
    assert mu.tolist() == [4.0, 2.0] and tr.tolist() == [0.0, 4.0]
    with pytest.raises(ValueError, match="num_groups must be an int >= 2"):
        noise_scale_parts(1.0, 1.0, num_groups=1)


# --- bad input: one clear line --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("grams", "match"),
    [
        (np.zeros((2, 3)), r"\[n, R, R\]"),
        ([np.eye(2), np.eye(3)], "one R"),
        ([np.eye(2), [[1.0, np.nan], [0.0, 1.0]]], r"grams\[1\] contains NaN"),
        ([[[1.0, 0.5], [0.0, 1.0]]], r"grams\[0\] is not symmetric"),
        ([[[-1.0, 0.0], [0.0, 1.0]]], r"grams\[0\] has a negative diagonal"),
        ([[[1.0, -3.0], [-3.0, 1.0]]], r"grams\[0\] has 1\^T K 1 = -4 < 0"),
        ([], "empty"),
    ],
)
def test_bad_grams_are_one_clear_line(grams: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        step_diagnostics(grams, tokens=[[1, 1]], rewards=[[1, 0]], total_grad_norm=1.0)


def test_bad_tokens_rewards_and_options_are_named() -> None:
    K = [np.eye(2)]
    with pytest.raises(ValueError, match=r"tokens must be shaped \[n, R\] = \[1, 2\]"):
        step_diagnostics(K, tokens=[1, 1], rewards=[[1, 0]], total_grad_norm=1.0)
    with pytest.raises(ValueError, match="tokens must be whole counts >= 0"):
        step_diagnostics(K, tokens=[[1, -1]], rewards=[[1, 0]], total_grad_norm=1.0)
    with pytest.raises(ValueError, match=r"rewards contains a non-finite value \(inf\)"):
        step_diagnostics(K, tokens=[[1, 1]], rewards=[[np.inf, 0]], total_grad_norm=1.0)
    with pytest.raises(ValueError, match="total_grad_norm must be finite"):
        step_diagnostics(K, tokens=[[1, 1]], rewards=[[1, 0]], total_grad_norm=math.nan)
    with pytest.raises(ValueError, match="dead_atol must be >= 0"):
        dead_groups(K, dead_atol=-1.0)
    with pytest.raises(ValueError, match=r"pass_grams\[0\]: pass_gram is 3 x 3: not a whole"):
        step_diagnostics(K, tokens=[[1, 1]], rewards=[[1, 0]], total_grad_norm=1.0,
                         pass_grams=[np.eye(3)])
    # a NaN reward (TRL's unscorable completion) is allowed: not a success
    d = step_diagnostics(K, tokens=[[1, 1]], rewards=[[np.nan, 1.0]], total_grad_norm=1.0)
    assert d["mass_share/solved_1_of_2"] == 1.0


def test_torch_grams_are_accepted() -> None:
    torch = pytest.importorskip("torch")
    K = torch.eye(2, dtype=torch.float32)[None].repeat(3, 1, 1)
    d = step_diagnostics(K, tokens=torch.ones(3, 2), rewards=torch.zeros(3, 2),
                         total_grad_norm=torch.tensor(2.0).item())
    assert d["groups"] == 3.0 and d["group_grad_norm/mean"] == pytest.approx(math.sqrt(2))


# --- invariances (hypothesis) ---------------------------------------------------------------------
@st.composite
def steps(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = draw(st.integers(2, 5))
    R = draw(st.integers(1, 4))
    d = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(n, R, d)) + draw(st.floats(-2, 2)) * rng.normal(size=d)
    dead = rng.random(n) < 0.3
    rows[dead] = 0.0
    L = rng.integers(0, 9, size=(n, R))
    r = rng.integers(0, 2, size=(n, R)).astype(float)
    return rows, L, r


def _diag_of(rows: np.ndarray, L: np.ndarray, r: np.ndarray) -> dict[str, float]:
    K = np.einsum("gid,gjd->gij", rows, rows)
    flat = rows.reshape(-1, rows.shape[-1])
    return step_diagnostics(K, tokens=L, rewards=r, pass_grams=[flat @ flat.T],
                            total_grad_norm=float(np.linalg.norm(flat.sum(axis=0))))


def _same(a: dict[str, float], b: dict[str, float], *, scale: dict[str, float] | None = None
          ) -> None:
    assert a.keys() == b.keys()
    for key in a:
        f = (scale or {}).get(key, 1.0)
        x, y = a[key], b[key] * f
        if math.isnan(x) or math.isnan(y):
            assert math.isnan(x) and math.isnan(y), key
        else:
            assert x == pytest.approx(y, rel=1e-9, abs=1e-9 * max(1.0, abs(f))), key


@settings(max_examples=50)
@given(steps(), st.integers(0, 10**6))
def test_permuting_groups_or_rollouts_changes_nothing(step_: tuple, seed: int) -> None:
    rows, L, r = step_
    base = _diag_of(rows, L, r)
    rng = np.random.default_rng(seed)
    p = rng.permutation(rows.shape[0])
    _same(_diag_of(rows[p], L[p], r[p]), base)
    q = rng.permutation(rows.shape[1])
    _same(_diag_of(rows[:, q], L[:, q], r[:, q]), base)


@settings(max_examples=50)
@given(steps(), st.floats(1e-3, 1e3))
def test_scaling_the_rows_scales_norms_and_parts_and_keeps_the_ratios(step_: tuple, c: float
                                                                      ) -> None:
    rows, L, r = step_
    base = _diag_of(rows, L, r)
    scaled = _diag_of(c * rows, L, r)
    first = {k: c for k in base if "_norm/" in k or k == "grad_norm"}
    second = {k: c * c for k in ("noise/mu_sq", "noise/trace_sigma", "noise/step_noise_sq")}
    if base["noise/status"] in (0.0, 4.0) and scaled["noise/status"] == base["noise/status"]:
        _same(scaled, base, scale={**first, **second})
    else:  # a status at the precision boundary may flip; the parts still scale
        for k, f in second.items():
            assert scaled[k] == pytest.approx(base[k] * f, rel=1e-9, abs=1e-9 * f)


def test_exhaustive_small_permutations_keep_the_dead_count() -> None:
    rows = np.zeros((3, 2, 2))
    rows[0] = [[1.0, 0.0], [0.0, 1.0]]
    rows[2] = [[1.0, 1.0], [-1.0, -1.0]]  # cancelling rows: G_g = 0 but live
    for p in permutations(range(3)):
        d = _diag_of(rows[list(p)], np.ones((3, 2), int), np.zeros((3, 2)))
        assert d["dead_groups/count"] == 1.0
