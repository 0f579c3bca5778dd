"""TRL: the training diagnostics of every measured step (``geometry/...`` in TRL's log, the
JSONL record's ``diagnostics``) against their definitions from brute-force per-row gradients.

A callback before each optimizer update (after TRL formed its gradient norm) takes every row's
gradient ``g_i = grad sum_t u_it log pi_it`` by its own backward (TRL's own log-probs, the
recorded ``u``) and TRL's accumulated ``.grad``; from those alone it forms each diagnostic by its
definition (``|g_i|``, ``|G_g| = |sum_{i in g} g_i|``, dead = every row exactly zero, the noise
parts from ``|G|^2`` and ``sum_g |G_g|^2``). TRL's fused head gives float32 log-probabilities, so
the engine's rows and these carry ~1e-7 relative differences (bound ``RTOL``, as in
``test_real_trl_geometry``); the pipeline from the recorded Grams and TRL's norm to the logged
keys is exact (1e-10). Tiny float64 model, slow tier (a few seconds per training).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from trl_geometry_helpers import _flat_grads, _weighted_grads, make_trainer  # noqa: E402

from grpo_theory.diagnostics import step_diagnostics  # noqa: E402
from real_model.integrations.protocol import padded_gram  # noqa: E402

RTOL = 1e-5
pytestmark = pytest.mark.slow


class RowsByGroup:
    """``on_pre_optimizer_step``: every group's brute-force rows, TRL's gradient, the record."""

    def __init__(self):
        from transformers import TrainerCallback

        outer = self

        class _CB(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kw):
                outer.take(state.global_step)

        self.callback, self.trainer, self.steps = _CB(), None, []

    def take(self, step):
        tr = self.trainer
        last, rec = tr.geometry_last, tr.geometry_records[-1]
        assert last["step"] == step and rec["step"] == step
        params = [p for p in tr.model.parameters() if p.requires_grad]
        grad = _flat_grads(params)
        saved = [None if p.grad is None else p.grad.clone() for p in params]
        G = int(tr.num_generations)
        groups: dict[int, dict] = {}
        for seg in last["segments"]:
            gen, rows, U = seg["generation"], seg["rows"], seg["token_weights"]
            g = _weighted_grads(tr, gen, rows, U, params).numpy()
            lm = gen.batch["completion_mask"].double()
            for k, r in enumerate(rows):
                key = gen.group_offset + (gen.first_row + int(r)) // G
                grp = groups.setdefault(key, {"rows": [], "tokens": [], "rewards": []})
                grp["rows"].append(g[k])
                grp["tokens"].append(float(lm[r].sum()))
                grp["rewards"].append(float(gen.rewards[r]))
        for p, s in zip(params, saved, strict=True):
            p.grad = s
        self.steps.append({"step": step, "grad": grad.numpy(), "groups": groups, "record": rec,
                           "row_grams": dict(last["row_grams"])})


def _definitions(step):
    """Each diagnostic by its definition, from the brute-force rows and TRL's gradient."""
    rows = [np.stack(g["rows"]) for g in step["groups"].values()]
    n = len(rows)
    norms = np.concatenate([np.linalg.norm(r, axis=1) for r in rows])
    Gg = np.stack([r.sum(axis=0) for r in rows])
    gn = np.linalg.norm(Gg, axis=1)
    dead = np.array([not r.any() for r in rows])
    tokens = [np.asarray(g["tokens"]) for g in step["groups"].values()]
    T = float(np.dot(step["grad"], step["grad"]))
    S = float((gn**2).sum())
    mu, tr = n / (n - 1) * (T - S), n / (n - 1) * (n * S - T)
    return {
        "rollout_grad_norm/mean": norms.mean(), "rollout_grad_norm/max": norms.max(),
        "rollout_grad_norm/rms": math.sqrt((norms**2).mean()),
        "group_grad_norm/mean": gn.mean(), "group_grad_norm/max": gn.max(),
        "group_grad_norm/rms": math.sqrt(S / n),
        "dead_groups/count": float(dead.sum()), "dead_groups/group_share": dead.mean(),
        "dead_groups/token_share": sum(t.sum() for t, d in zip(tokens, dead, strict=True) if d)
        / sum(t.sum() for t in tokens),
        "noise/mu_sq": mu, "noise/trace_sigma": tr, "noise/step_noise_sq": tr / n,
        "noise/snr": mu / (tr / n),
        "alignment/weighted_cos": (T - S) / (gn.sum() ** 2 - S) if (gn > 0).sum() > 1
        else math.nan,
    }, {"mu": max(abs(T), n * S), "norm": max(norms.max(), 1e-300)}


def _run(tmp_path, **kw):
    rows = RowsByGroup()
    tr = make_trainer(tmp_path, callbacks=[rows.callback], **kw)
    rows.trainer = tr
    tr.train()
    return tr, rows


def _assert_definitions(tr, rows):
    logged = [h for h in tr.state.log_history if "loss" in h]
    assert len(logged) == len(rows.steps)
    for step, h in zip(rows.steps, logged, strict=True):
        d = step["record"]["diagnostics"]
        ref, scale = _definitions(step)
        for key, want in ref.items():
            if key.startswith("noise/"):
                tol = RTOL * scale["mu"] * (1 if "snr" not in key else
                                            1 / max(abs(ref["noise/step_noise_sq"]), 1e-300))
                assert abs(d[key] - want) <= tol, (step["step"], key, d[key], want)
            elif math.isnan(want):
                assert math.isnan(d[key]), key
            else:
                assert d[key] == pytest.approx(want, rel=RTOL, abs=RTOL * scale["norm"]), key
        # TRL's own norm fed |G|: d["grad_norm"] is it, and it is |sum of the rows|
        assert d["grad_norm"] == pytest.approx(h["grad_norm"], rel=1e-12)
        assert step["record"]["diagnostics_grad_norm_from"] == "host"
        # logged under geometry/<key>, the same values (one step per log)
        for key, v in d.items():
            if key not in ("groups", "grad_norm") and math.isfinite(v):
                assert h[f"geometry/{key}"] == pytest.approx(v, rel=1e-12), key
        # the pipeline: recorded Grams + TRL's norm -> the keys, exactly
        grams, toks, rews = [], [], []
        for g in step["record"]["group_records"]:
            K = step["row_grams"].get(g["group"], np.zeros((0, 0)))
            pos = [g["rows"].index(r) for r in g.get("measured_rows", [])]
            grams.append(padded_gram(K, pos, len(g["rows"])))
            toks.append(g["lengths"])
            rews.append([math.nan if x is None else x for x in g["rewards"]])
        exact = step_diagnostics(np.stack(grams), tokens=toks, rewards=rews,
                                 total_grad_norm=h["grad_norm"])
        for key, v in exact.items():
            assert (math.isnan(v) and math.isnan(d[key])) or d[key] == pytest.approx(
                v, rel=1e-10, abs=1e-300), key


@pytest.mark.parametrize("mode", ["second_pass", "in_run"])
def test_diagnostics_equal_their_definitions_from_per_row_gradients(tmp_path, mode):
    tr, rows = _run(tmp_path, max_steps=2, geometry_mode=mode, per_device_train_batch_size=8,
                    gradient_accumulation_steps=1)
    assert [s["step"] for s in rows.steps] == [0, 1]
    _assert_definitions(tr, rows)


def _one_constant_prompt(prompts, completions, **kw):
    """``3+4=`` always scores 1 (its group is constant: zero advantages), others parity."""
    return [1.0 if p.startswith("3+4") else float(sum(map(ord, c)) % 2 == 0)
            for p, c in zip(prompts, completions, strict=True)]


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_dead_groups_are_counted_from_the_rows_under_every_scale_rewards(tmp_path,
                                                                         scale_rewards):
    rows = RowsByGroup()
    tr = make_trainer(tmp_path, callbacks=[rows.callback], max_steps=1,
                      scale_rewards=scale_rewards, per_device_train_batch_size=8,
                      gradient_accumulation_steps=1, shuffle_dataset=False,
                      prompts=["3+4=", "1+2="] * 16)
    tr.reward_funcs[0] = _one_constant_prompt
    rows.trainer = tr
    tr.train()
    d = rows.steps[0]["record"]["diagnostics"]
    assert d["dead_groups/count"] == 1.0 and d["dead_groups/group_share"] == 0.5
    assert d["dead_groups/rollout_share"] == 0.5
    _assert_definitions(tr, rows)
    trl_flag = tr.state.log_history[0]["frac_reward_zero_std"]
    assert trl_flag == (0.0 if scale_rewards == "batch" else 0.5)  # TRL's metric: a batch flag
