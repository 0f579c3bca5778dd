"""The audit behind ``grpo-audit frameworks``: the frameworks' own code against ``grpo_theory``.

For every advantage setting and loss mode a framework ships (and this library maps), the
command runs the framework's code (:mod:`grpo_audit.framework_code`) in its training dtype on a
fixed battery of inputs (:func:`battery`) and compares it with the ``grpo_theory`` function
that the conventions table says is equivalent (:data:`ADVANTAGE_MAP`, :data:`LOSS_MAP`). Each
case ends in one of

* ``agree``: ``|framework - ours| <= 1e-5 * max|ours|`` on every token-carrying completion;
* ``differs``: a larger difference (its max abs diff is reported);
* ``framework non-finite``: the framework returns NaN/inf where ``grpo_theory`` is finite;
* ``framework raises`` / ``grpo_theory refuses`` / ``both refuse``: an exception on one or both
  sides (``grpo_theory`` refuses NaN rewards, one-sample groups, 0/0 baselines by design).

The table lists, per setting, the agreeing cases, the largest difference among them, and for
each kind of discrepancy the smallest input that shows it. Everything printed is computed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Case",
    "battery",
    "ADVANTAGE_MAP",
    "LOSS_MAP",
    "audit_framework",
    "render_markdown",
]

RTOL = 1e-5


@dataclass(frozen=True)
class Case:
    """One battery input: rewards ``[P, R]`` (NaN allowed) and completion lengths ``[P, R]``."""

    name: str
    rewards: np.ndarray
    lengths: np.ndarray
    family: str = ""

    @property
    def size(self) -> int:
        return int(self.rewards.size)

    def short(self) -> str:
        r = self.rewards
        rows = []
        for p in range(r.shape[0]):
            row = r[p]
            if r.shape[1] > 4 and np.all(row == row[0]):
                rows.append(f"[{row[0]:.6g}]*{r.shape[1]}")
            else:
                rows.append("[" + ", ".join(f"{v:.4g}" for v in row) + "]")
        txt = "[" + ", ".join(rows) + "]"
        if len(txt) > 70:
            txt = txt[:67] + "..."
        L = self.lengths
        if np.all(L == L.flat[0]):
            return f"{txt}, L={int(L.flat[0])}"
        return f"{txt}, L={L.astype(int).tolist()}" if L.size <= 8 else f"{txt}, L varies"


def battery(*, seed: int = 0) -> list[Case]:
    """The fixed input battery (seeded; the same on every run)."""
    rng = np.random.default_rng(seed)
    cases: list[Case] = []

    def add(name: str, r: Any, L: Any = None) -> None:
        r = np.asarray(r, dtype=np.float64)
        L = np.full(r.shape, 5) if L is None else np.asarray(L)
        family = name.split(" [")[0].split(" R=")[0].split(" 1e")[0].split(" (")[0]
        cases.append(Case(name, r, L.astype(np.int64), family))

    for R in (2, 3, 4, 8, 16):
        add(f"random normal R={R}", rng.normal(size=(3, R)), rng.integers(1, 13, (3, R)))
    for R in (4, 8, 16):
        add(f"random binary R={R}", rng.integers(0, 2, (4, R)), rng.integers(1, 13, (4, R)))
    add("constant [0.7]*16", [[0.7] * 16])
    add("constant [123.456]*12", [[123.456] * 12])
    add("constant [123.456]*5", [[123.456] * 5])
    add("constant [0.1]*3", [[0.1] * 3])
    add("constant [1.0]*4 (exact in float32)", [[1.0] * 4])
    add("constant [0.7]*16 + a random group", [[0.7] * 16, list(rng.normal(size=16))])
    add("single success R=8", [[1.0] + [0.0] * 7])
    add("single success R=16", [[1.0] + [0.0] * 15])
    add("singletons R=1", [[1.0], [0.0], [0.5], [2.0]])
    add("NaN in a group", [[1.0, np.nan, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    add("NaN group", [[np.nan, np.nan], [1.0, 0.0]])
    add("huge scale 1e9", 1e9 * rng.normal(size=(3, 4)))
    add("tiny scale 1e-9", 1e-9 * rng.normal(size=(3, 4)))
    add("overflow [1e30, -1e30]", [[1e30, -1e30]])
    add("overflow [1e200, -1e200]", [[1e200, -1e200]])
    add("underflow [1e-30, 0]", [[1e-30, 0.0]])
    add("underflow [4e-233, 0]", [[4e-233, 0.0]])
    add(
        "unequal lengths",
        rng.integers(0, 2, (3, 8)).astype(float),
        rng.integers(1, 201, (3, 8)),
    )
    add("empty completions", rng.normal(size=(3, 4)), [[0, 3, 5, 2], [4, 0, 0, 7], [1, 1, 1, 1]])
    add("empty group", [[1.0, 0.0, 0.0], [0.5, 1.0, 0.0]], [[0, 0, 0], [3, 2, 4]])
    return cases


# --- grpo_theory side -----------------------------------------------------------------------------
def _scored_whiten(a: np.ndarray, ok: np.ndarray, *, eps: float) -> np.ndarray:
    from grpo_theory import whiten

    out = np.zeros_like(a)
    if ok.sum() >= 2:
        out[ok] = whiten(a[ok][None, :], ddof=1, eps=eps, eps_mode="add_std")[0]
    return out


def _ours_advantages() -> dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]]:
    import grpo_theory as gt

    def est(name: str, **o: Any) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        return lambda r, L: np.asarray(gt.compute_advantages(name, r, **o), dtype=np.float64)

    def trl_rloo_norm(r: np.ndarray, L: np.ndarray) -> np.ndarray:
        a = gt.nan_excluding_advantages("rloo", r)
        return _scored_whiten(a, ~np.isnan(r), eps=1e-4)

    def verl_gdpo(r: np.ndarray, L: np.ndarray) -> np.ndarray:
        a = gt.compute_advantages("grpo_std", r, ddof=1, eps=1e-6)
        return np.asarray(gt.whiten(a, lengths=L, ddof=1, eps=1e-8, eps_mode="add_var"))

    g4 = {"ddof": 1, "eps": 1e-4}
    return {
        'GRPOConfig(scale_rewards="group")': (
            "nan_excluding_advantages('grpo_std', ddof=1, eps=1e-4)",
            lambda r, L: gt.nan_excluding_advantages("grpo_std", r, **g4),
        ),
        'GRPOConfig(scale_rewards="batch")': (
            "grpo_std(ddof=1, eps=1e-4, std_scope='batch')",
            est("grpo_std", std_scope="batch", **g4),
        ),
        'GRPOConfig(scale_rewards="none")': (
            "nan_excluding_advantages('grpo')",
            lambda r, L: gt.nan_excluding_advantages("grpo", r),
        ),
        'GRPOConfig(multi_objective_aggregation="normalize_then_sum")': (
            "gdpo_advantages(rewards[..., None])",
            lambda r, L: gt.gdpo_advantages(r[..., None]),
        ),
        "RLOOConfig()": (
            "nan_excluding_advantages('rloo')",
            lambda r, L: gt.nan_excluding_advantages("rloo", r),
        ),
        "RLOOConfig(normalize_advantages=True)": (
            "rloo_normalized (NaN-excluding)",
            trl_rloo_norm,
        ),
        "algorithm.adv_estimator=grpo": (
            "grpo_std(ddof=1, eps=1e-6)",
            est("grpo_std", ddof=1, eps=1e-6),
        ),
        "algorithm.adv_estimator=grpo, norm_adv_by_std_in_grpo=False": ("grpo", est("grpo")),
        "algorithm.adv_estimator=rloo": ("rloo", est("rloo")),
        "algorithm.adv_estimator=reinforce_plus_plus": (
            "reinforce_plus_plus(lengths)",
            lambda r, L: gt.reinforce_plus_plus_advantages(r, lengths=L),
        ),
        "algorithm.adv_estimator=reinforce_plus_plus_baseline": (
            "reinforce_plus_plus_baseline(lengths)",
            lambda r, L: gt.reinforce_plus_plus_baseline_advantages(r, lengths=L),
        ),
        "algorithm.adv_estimator=opo": (
            "opo(lengths)",
            lambda r, L: gt.opo_advantages(r, lengths=L),
        ),
        "algorithm.adv_estimator=gpg": ("gpg", est("gpg")),
        "algorithm.adv_estimator=grpo_passk": ("grpo_passk", est("grpo_passk")),
        "algorithm.adv_estimator=gdpo (one reward key)": (
            "grpo_std(eps=1e-6) then whiten(lengths)",
            verl_gdpo,
        ),
        "--algo.advantage.estimator group_norm": (
            "grpo_std(ddof=1, eps=1e-9)",
            est("grpo_std", ddof=1, eps=1e-9),
        ),
        "--algo.advantage.estimator dr_grpo": ("grpo", est("grpo")),
        "--algo.advantage.estimator rloo": ("rloo", est("rloo")),
        "--algo.advantage.estimator reinforce_baseline": (
            "reinforce_baseline(lengths)",
            lambda r, L: gt.reinforce_baseline_advantages(r, lengths=L),
        ),
        "--algo.advantage.estimator flash_reinforce": ("flash_reinforce", est("flash_reinforce")),
    }


def _ours_losses() -> dict[str, tuple[str, Callable[..., np.ndarray]]]:
    from grpo_theory.aggregation import aggregation_weights, policy_loss_weights
    from grpo_theory.conventions import TRL_LOSS_TYPES, TrlLossType

    def agg(mode: str, **o: Any) -> Callable[..., np.ndarray]:
        def f(L: np.ndarray, width: int) -> np.ndarray:
            kw = dict(o)
            if mode == "dr_grpo":
                kw["max_tokens"] = width
            return aggregation_weights(L, mode=mode, **kw)  # type: ignore[arg-type]

        return f

    def pol(loss: str, **o: Any) -> Callable[..., np.ndarray]:
        return lambda L, width: policy_loss_weights(L, loss=loss, **o)

    def label(name: str, **o: Any) -> str:
        return f"policy_loss_weights({name!r}" + "".join(f", {k}={v!r}" for k, v in o.items()) + ")"

    def trl(lt: TrlLossType) -> tuple[str, Callable[..., np.ndarray]]:
        if lt.policy_loss is not None:
            opts = lt.policy_options
            return label(lt.policy_loss, **opts), pol(lt.policy_loss, **opts)
        mode = str(lt.aggregation)
        return ("dr_grpo(max_tokens=width)" if mode == "dr_grpo" else mode), agg(mode)

    skip = {"empty_completions": "skip"}
    return {
        **{lt.setting: trl(lt) for lt in TRL_LOSS_TYPES.values()},
        'GRPOConfig(loss_type="cispo", epsilon_high=5.0)': (
            label("cispo", epsilon_high=5.0),
            pol("cispo", epsilon_high=5.0),
        ),
        'GRPOConfig(loss_type="grpo", importance_sampling_level="sequence") (GSPO)': (
            "policy_loss_weights('gspo')",
            pol("gspo"),
        ),
        "RLOOTrainer loss": ("sequence_sum", agg("sequence_sum")),
        "actor.loss_agg_mode=token-mean": ("token_mean", agg("token_mean")),
        "actor.loss_agg_mode=token-sum": ("token_sum", agg("token_sum")),
        "actor.loss_agg_mode=seq-mean-token-mean": (
            "sequence_mean(empty_completions='skip')",
            agg("sequence_mean", **skip),
        ),
        "actor.loss_agg_mode=seq-mean-token-sum": (
            "sequence_sum(empty_completions='skip')",
            agg("sequence_sum", **skip),
        ),
        "actor.loss_agg_mode=seq-mean-token-sum-norm": (
            "dr_grpo(max_tokens=loss_scale_factor=width, empty_completions='skip')",
            agg("dr_grpo", **skip),
        ),
        "policy_loss=gspo, token-mean": ("token_mean", agg("token_mean")),
        "policy_loss=gspo, seq-mean-token-mean": (
            "sequence_mean(empty_completions='skip')",
            agg("sequence_mean", **skip),
        ),
        "policy_loss=sapo (any loss_agg_mode)": (
            "policy_loss_weights('sapo', empty_completions='skip')",
            pol("sapo", **skip),
        ),
        "policy_loss=cispo, token-mean": ("policy_loss_weights('cispo')", pol("cispo")),
        "token_level_loss=True (PolicyLoss default)": ("token_mean", agg("token_mean")),
        "token_level_loss=False": (
            "sequence_mean(empty_completions='skip')",
            agg("sequence_mean", **skip),
        ),
        'policy_loss_type="gspo"': (
            "policy_loss_weights('gspo', empty_completions='skip')",
            pol("gspo", **skip),
        ),
    }


ADVANTAGE_MAP = _ours_advantages
LOSS_MAP = _ours_losses


# --- comparing ------------------------------------------------------------------------------------
def _compare(
    fw: Callable[[], np.ndarray], ours: Callable[[], np.ndarray], carry: np.ndarray
) -> dict[str, Any]:
    """Run both sides; classify; ``carry`` marks the entries that matter (tokens exist)."""
    fw_err = our_err = None
    a = b = None
    try:
        a = np.asarray(fw(), dtype=np.float64)
    except Exception as exc:  # noqa: BLE001 - any framework failure is a finding
        fw_err = f"{type(exc).__name__}: {exc}"[:160]
    try:
        b = np.asarray(ours(), dtype=np.float64)
    except (ValueError, TypeError) as exc:
        our_err = f"{type(exc).__name__}: {exc}"[:160]
    if fw_err and our_err:
        return {"status": "both refuse", "framework": fw_err, "grpo_theory": our_err}
    if our_err:
        assert a is not None
        nonfinite = bool(np.any(~np.isfinite(a[carry])))
        return {
            "status": "grpo_theory refuses",
            "grpo_theory": our_err,
            "framework_nonfinite": nonfinite,
            "framework_max_abs": float(np.nanmax(np.abs(a[carry]), initial=0.0)),
        }
    if fw_err:
        return {"status": "framework raises", "framework": fw_err}
    assert a is not None and b is not None
    x, y = a[carry], b[carry]
    if x.size == 0:
        return {"status": "agree", "max_abs_diff": 0.0, "max_rel_diff": 0.0}
    if np.any(~np.isfinite(x)):
        i = int(np.argmax(~np.isfinite(x)))
        return {
            "status": "framework non-finite",
            "max_abs_diff": math.inf,
            "at": {"framework": float(x[i]), "grpo_theory": float(y[i])},
        }
    scale = float(np.max(np.abs(y)))
    d = float(np.max(np.abs(x - y)))
    rel = d / scale if scale > 0 else (0.0 if d == 0 else math.inf)
    status = "agree" if d <= RTOL * scale else "differs"
    i = int(np.argmax(np.abs(x - y)))
    return {
        "status": status,
        "max_abs_diff": d,
        "max_rel_diff": rel,
        "at": {"framework": float(x[i]), "grpo_theory": float(y[i])},
    }


def audit_framework(
    framework: str, source: str | None = None, *, dtype: str = "float32"
) -> dict[str, Any]:
    """Run the battery for one framework; returns a JSON-ready dict (``rows``, ``cases``)."""
    from .framework_code import load_framework

    fc = load_framework(framework, source, dtype=dtype)
    cases, skipped = [], []
    for c in battery():
        (cases if _representable(c.rewards, dtype) else skipped).append(c)
    ours_a, ours_l = ADVANTAGE_MAP(), LOSS_MAP()
    rows: list[dict[str, Any]] = []
    for kind, table, ours_map in (
        ("advantage", fc.advantages, ours_a),
        ("loss", fc.losses, ours_l),
    ):
        for setting, fn in table.items():
            if setting not in ours_map:
                continue
            label, ours = ours_map[setting]
            results = []
            for c in cases:
                carry = c.lengths > 0
                if kind == "advantage":
                    res = _compare(
                        lambda c=c, fn=fn: fn(c.rewards, c.lengths),
                        lambda c=c, ours=ours: ours(c.rewards, c.lengths),
                        carry,
                    )
                else:
                    if np.any(np.isnan(c.rewards)) or c.lengths.max() == 0:
                        continue
                    A = np.where(np.arange(c.size).reshape(c.rewards.shape) % 2 == 0, 1.0, -0.5)
                    width = max(int(c.lengths.max()), 1)
                    res = _compare(
                        lambda c=c, fn=fn, A=A: fn(c.lengths, A),
                        lambda c=c, ours=ours, width=width: ours(c.lengths, width),
                        carry,
                    )
                res["case"] = c.name
                res["family"] = c.family
                res["size"] = c.size
                res["input"] = c.short()
                results.append(res)
            rows.append(_summarise(kind, setting, label, results))
    return {
        "framework": fc.framework,
        "version": fc.version,
        "source": fc.origin,
        "commit": fc.commit,
        "dtype": dtype,
        "rtol": RTOL,
        "not_representable": [c.name for c in skipped],
        "edge_values": _edge_values(framework, rows),
        "rows": rows,
    }


DEFAULT_SETTING = {
    "trl": 'GRPOConfig(scale_rewards="group")',
    "verl": "algorithm.adv_estimator=grpo",
    "openrlhf": "--algo.advantage.estimator group_norm",
}
EDGE_FAMILIES = ("constant", "overflow", "underflow")


def _representable(r: np.ndarray, dtype: str) -> bool:
    """True when every reward survives the cast to ``dtype`` (no inf, no flush to 0)."""
    if dtype == "float64":
        return True
    with np.errstate(over="ignore", under="ignore"):
        x = r.astype(np.float32)
    ok = np.isnan(r) | (np.isfinite(x) & ((r == 0) | (x != 0)))
    return bool(np.all(ok))


def _edge_values(framework: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The default setting's value on constant / overflow / underflow cases (both sides)."""
    row = next((r for r in rows if r["setting"] == DEFAULT_SETTING[framework]), None)
    if row is None:
        return []
    out = []
    for res in row["results"]:
        if res["family"] in EDGE_FAMILIES and "at" in res:
            out.append(
                {
                    "setting": row["setting"],
                    "case": res["case"],
                    "framework": res["at"]["framework"],
                    "grpo_theory": res["at"]["grpo_theory"],
                }
            )
    return out


def _summarise(kind: str, setting: str, ours: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    agree = [r for r in results if r["status"] in ("agree", "both refuse")]
    max_agree = max((r.get("max_rel_diff", 0.0) for r in agree), default=0.0)
    kinds: dict[str, dict[str, Any]] = {}
    for r in sorted(results, key=lambda r: (r["size"], r["case"])):
        if r["status"] in ("agree", "both refuse"):
            continue
        k = kinds.setdefault(
            f"{r['status']} ({r['family']})", {"cases": [], "smallest": r, "max_abs_diff": 0.0}
        )
        k["cases"].append(r["case"])
        d = r.get("max_abs_diff")
        if isinstance(d, float):
            k["max_abs_diff"] = max(k["max_abs_diff"], d)
    return {
        "kind": kind,
        "setting": setting,
        "grpo_theory": ours,
        "agree": len(agree),
        "total": len(results),
        "max_rel_diff_agreeing": max_agree,
        "discrepancies": kinds,
        "results": results,
    }


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.2g}"
    return str(x)


def render_markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown table (one line per setting and kind of discrepancy)."""
    head = (
        f"### {report['framework']} {report['version']} ({report['dtype']}; source "
        f"`{report['source']}`{'; commit ' + report['commit'] if report['commit'] else ''})\n\n"
        f"agree: |framework - grpo_theory| <= {report['rtol']:g} * max|grpo_theory| on every "
        "completion with tokens (losses: per-sequence gradient weights at ratio 1).\n\n"
        "| setting | grpo_theory | agree | max rel diff (agreeing) | discrepancy (family) | "
        "cases | smallest input showing it | max abs diff (family) |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    if report["not_representable"]:
        head = head.replace(
            "\n\n| setting",
            f"\n\nSkipped (rewards not representable in {report['dtype']}): "
            + ", ".join(report["not_representable"])
            + ".\n\n| setting",
            1,
        )
    for row in report["rows"]:
        base = (
            f"| `{row['setting']}` | {row['grpo_theory']} | {row['agree']}/{row['total']} | "
            f"{_fmt(row['max_rel_diff_agreeing'])} |"
        )
        if not row["discrepancies"]:
            lines.append(base + " - | - | - | - |")
            continue
        for kind, info in row["discrepancies"].items():
            s = info["smallest"]
            there: Any = info["max_abs_diff"]
            if kind.startswith("grpo_theory refuses"):
                there = "framework non-finite" if s.get("framework_nonfinite") else "-"
            elif kind.startswith("framework raises"):
                there = s.get("framework", "")[:60]
            elif kind.startswith("framework non-finite"):
                there = "NaN/inf"
            detail = f"{s['case']}: `{s['input']}`"
            lines.append(f"{base} {kind} | {len(info['cases'])} | {detail} | {_fmt(there)} |")
            base = "| | | | |"
    edge = ""
    if report["edge_values"]:
        edge = (
            f"\nEdge values of `{report['edge_values'][0]['setting']}` (the advantage of the "
            "largest disagreement in each case):\n\n"
            "| case | framework | grpo_theory |\n|---|---|---|\n"
        )
        edge += "\n".join(
            f"| {e['case']} | {e['framework'] + 0.0:.3g} | {e['grpo_theory'] + 0.0:.4g} |"
            for e in report["edge_values"]
        )
        edge += "\n"
    return head + "\n".join(lines) + "\n" + edge
