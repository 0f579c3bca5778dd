"""The KL options of TRL, verl and OpenRLHF at the gradient level, from their own code.

Each framework module (:mod:`.kl_trl`, :mod:`.kl_verl`, :mod:`.kl_openrlhf`) lists its KL options
as :class:`KLSetting` (a per-token KL term: in the loss, or in the per-token reward) or
:class:`KLGroupSetting` (a KL summed into the sequence reward before a group-normalised
advantage), each runnable through the framework's own code, with what ``grpo_theory.kl`` says it
is (``model``: the arguments of :func:`grpo_theory.kl.kl_coefficients`).

For a per-token setting the framework's code is differentiated by autograd: the gradient of its
KL term with respect to the token log-probs, divided by ``beta`` and by the aggregation weight
``w_i`` of :func:`grpo_theory.aggregation.aggregation_weights`, is the coefficient ``c_it`` of
the token score (the KL term moves token ``t`` of rollout ``i`` by ``-beta w_i c_it``, so the
GRPO weight ``w_i A_i`` of that token becomes ``w_i (A_i - beta c_it)``:
:func:`grpo_theory.kl.regularised_token_weights`). The audit

1. compares the framework's ``c`` with ``grpo_theory``'s on a battery (on- and off-policy,
   unequal lengths, large log-ratios): ``agree`` within ``1e-5 * max|ours|``, else the largest
   difference and the smallest input showing it;
2. takes the exact expected gradient ``E_q[sum_t c_t S_t]`` of the framework's ``c`` over every
   response of two exact worlds (:func:`worlds`: a 3-arm softmax bandit; a tabular token MDP,
   ``V = 2``, ``T = 3``; on-policy, and with samples from a stale ``pi_old``) and names what it is
   (:func:`grpo_theory.kl.classify_gradient`): the reverse-KL gradient ``grad KL(pi || pi_ref)``,
   the forward one, their per-token ("partial") forms, zero, or a biased mix (its cosine with
   ``grad KL(pi || pi_ref)``).

For a group setting (verl's ``use_kl_in_reward`` with the GRPO estimator) every group of ``G = 4``
responses of the token MDP is enumerated; the framework's advantages are compared with
``grpo_theory.compute_advantages`` on the KL-shaped rewards, and the KL's contribution to the
expected GRPO gradient, ``(E[g](0) - E[g](beta)) / beta``, is classified the same way.

Every number printed is computed; the conclusion of each table is generated from its rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from grpo_theory import kl
from grpo_theory.aggregation import aggregation_weights

from .compare import RTOL, compare
from .source import FrameworkCodeError, SourceTree, find_source

__all__ = ["BETA", "KLSetting", "KLGroupSetting", "KLOptions", "worlds", "audit_kl",
           "render_kl_markdown", "docs_markdown", "autograd_coefficients", "RTOL"]

#: The KL coefficient the options are run with (any beta > 0: coefficients are per unit beta).
BETA = 0.1
#: Group size of the group settings.
GROUP_SIZE = 4


@dataclass(frozen=True)
class KLSetting:
    """A per-token KL option.

    Attributes:
        setting: the configuration that selects it.
        model: ``grpo_theory.kl.kl_coefficients`` keyword arguments (estimator, placement, ...)
            of what it is; the stale-reward placements set ``stale=True`` (their estimator reads
            ``pi_old``'s log-ratio and the policy loss's ratio weights it).
        coefficients: ``f(logp [B, T], ref [B, T], old [B, T], lengths [B], dtype) -> c [B, T]``
            through the framework's own code.
        mode: the aggregation of the KL term (for the read-out of ``c``).
        default: the framework's default KL setting once KL is switched on.
    """

    setting: str
    model: dict[str, Any]
    coefficients: Callable[..., np.ndarray]
    mode: str = "token_mean"
    default: bool = False


@dataclass(frozen=True)
class KLGroupSetting:
    """A KL in the sequence reward of a group-normalised advantage.

    Attributes:
        setting: the configuration.
        estimator: the per-token estimator summed into the sequence reward.
        advantages: ``f(rewards [M, G], old [M, G, T], ref [M, G, T], beta) -> A [M, G]`` through
            the framework's own code.
        ours: ``(name, options)`` of ``grpo_theory.compute_advantages`` on the KL-shaped reward.
    """

    setting: str
    estimator: str
    advantages: Callable[..., np.ndarray]
    ours: tuple[str, dict[str, Any]]
    default: bool = False


@dataclass
class KLOptions:
    """A framework's KL options and the defaults read from its source."""

    settings: list[KLSetting] = field(default_factory=list)
    groups: list[KLGroupSetting] = field(default_factory=list)
    defaults: dict[str, Any] = field(default_factory=dict)


# --- reading coefficients off autograd ------------------------------------------------------------
def autograd_coefficients(loss_fn: Callable[..., Any], logp: np.ndarray, ref: np.ndarray,
                          old: np.ndarray, lengths: np.ndarray, *, dtype: Any, mode: str,
                          beta: float = BETA) -> np.ndarray:
    """``c = (d loss / d logp) / (beta w_i)``: ``loss_fn(logp, ref, old, mask)`` is the framework's
    KL term (times ``beta``) on torch tensors of ``dtype``; ``w_i`` the aggregation weight of
    ``mode``. Masked tokens get 0."""
    import torch

    from .adapter import completion_masks

    T = logp.shape[1]
    mask = completion_masks(lengths, T).to(dtype)
    lp = torch.tensor(logp, dtype=dtype, requires_grad=True)
    loss = loss_fn(lp, torch.tensor(ref, dtype=dtype), torch.tensor(old, dtype=dtype), mask)
    (g,) = torch.autograd.grad(loss, lp, allow_unused=True)
    g = np.zeros(logp.shape) if g is None else g.detach().double().numpy()
    w = aggregation_weights(np.asarray(lengths)[None, :], mode=mode)[0]  # type: ignore[arg-type]
    on = np.arange(T)[None, :] < np.asarray(lengths)[:, None]
    return np.where(on, g / (beta * np.where(w > 0, w, 1.0))[:, None], 0.0)


# --- worlds ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class World:
    """Every response of an exact world: token log-probs under pi, pi_ref, pi_old; scores; laws."""

    name: str
    logp: np.ndarray
    ref: np.ndarray
    old: np.ndarray
    scores: np.ndarray
    rewards: np.ndarray

    @property
    def probs(self) -> np.ndarray:
        return np.exp(self.logp.sum(axis=1))

    @property
    def old_probs(self) -> np.ndarray:
        return np.exp(self.old.sum(axis=1))

    def targets(self) -> dict[str, np.ndarray]:
        return kl.kl_gradient_targets(self.logp, self.ref, self.scores)


def _world(name: str, logits: np.ndarray, ref: np.ndarray, old: np.ndarray, V: int, T: int,
           rewards: np.ndarray) -> World:
    f = kl.tabular_token_log_probs
    return World(name, f(logits, vocab=V, length=T), f(ref, vocab=V, length=T),
                 f(old, vocab=V, length=T), kl.tabular_token_scores(logits, vocab=V, length=T),
                 rewards)


@lru_cache(maxsize=1)
def worlds() -> dict[str, World]:
    """The exact worlds: ``bandit`` (3 arms), ``token_mdp`` (tabular softmax, V = 2, T = 3,
    binary task reward), each with a reference; ``pi_old`` is ``pi`` moved by a seeded step."""
    rng = np.random.default_rng(4343)
    th = np.array([[0.6, 0.0, -0.4]])
    bandit = _world("bandit", th, np.array([[0.0, 0.3, 0.2]]), th - np.array([[0.3, -0.2, 0.1]]),
                    3, 1, np.array([0.8, 0.4, 0.1]))
    n = 7
    lg = 0.8 * rng.standard_normal((n, 2))
    mdp = _world("token_mdp", lg, 0.8 * rng.standard_normal((n, 2)),
                 lg + 0.3 * rng.standard_normal((n, 2)), 2, 3,
                 (rng.random(8) < 0.5).astype(float))
    return {"bandit": bandit, "token_mdp": mdp}


def battery(seed: int = 0) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """``(name, logp, ref, old, lengths)``: on-policy and off-policy inputs with unequal lengths,
    and large log-ratios (|log pi - log pi_ref| up to 30)."""
    rng = np.random.default_rng(seed)
    B, T = 6, 7
    L = np.array([7, 3, 5, 1, 6, 4])
    logp = np.log(rng.uniform(0.05, 0.95, (B, T)))
    ref = logp + rng.normal(0, 0.7, (B, T))
    old = logp + rng.normal(0, 0.03, (B, T))
    big = np.where(np.arange(T) < 3, logp - rng.choice([-30.0, -12.0, 12.0, 30.0], (B, T)), ref)
    return [("on-policy, unequal lengths", logp, ref, logp.copy(), L),
            ("off-policy (log pi - log pi_old ~ N(0, 0.03^2))", logp, ref, old, L),
            ("large log-ratios (|lr| up to 30)", logp, big, logp.copy(), L)]


# --- one setting ----------------------------------------------------------------------------------
def _ours(model: dict[str, Any], logp: np.ndarray, ref: np.ndarray, old: np.ndarray,
          lengths: np.ndarray) -> np.ndarray:
    if not model:
        raise ValueError("grpo_theory.kl has no per-token form of this option")
    m = dict(model)
    stale = m.pop("stale", False)
    mask = np.arange(logp.shape[1])[None, :] < lengths[:, None]
    if stale:  # the estimator at pi_old, weighted by the policy loss's ratio pi / pi_old
        return kl.kl_coefficients(old - ref, log_ratio_old=logp - old, importance="token",
                                  mask=mask, **m)
    return kl.kl_coefficients(logp - ref, log_ratio_old=logp - old, mask=mask, **m)


def _class(g: np.ndarray, targets: dict[str, np.ndarray]) -> dict[str, Any]:
    c = kl.classify_gradient(g, targets, rtol=1e-7)
    return {"label": c.label, "matches": list(c.matches), "scale": c.scale,
            "cos_reverse": c.cos_reverse, "rel_error_reverse": c.rel_error_reverse}


def audit_setting(s: KLSetting, dtype: Any) -> dict[str, Any]:
    """Battery agreement and the exact expected gradient in each world for one setting."""
    import torch

    bat = []
    for name, logp, ref, old, L in battery():
        carry = np.arange(logp.shape[1])[None, :] < L[:, None]
        res = compare(lambda lp=logp, r=ref, o=old, L=L: s.coefficients(lp, r, o, L, dtype),
                       lambda lp=logp, r=ref, o=old, L=L: _ours(s.model, lp, r, o, L), carry)
        res["case"] = name
        bat.append(res)
    row: dict[str, Any] = {"setting": s.setting, "model": s.model, "mode": s.mode,
                           "default": s.default, "battery": bat,
                           "agree": sum(r["status"] == "agree" for r in bat), "total": len(bat)}
    for wname, w in worlds().items():
        L = np.full(w.logp.shape[0], w.logp.shape[1])
        for phase, old, q in (("on_policy", w.logp, w.probs), ("off_policy", w.old, w.old_probs)):
            try:
                c = s.coefficients(w.logp, w.ref, old, L, torch.float64)
            except Exception as exc:  # noqa: BLE001 - a framework that raises is a finding
                row[f"{wname}_{phase}"] = {"label": "framework raises",
                                           "error": f"{type(exc).__name__}: {exc}"[:120]}
                continue
            g = kl.expected_kl_gradient(c, probs=q, scores=w.scores)
            row[f"{wname}_{phase}"] = _class(g, w.targets())
            if wname == "token_mdp" and phase == "on_policy":
                spread = np.ptp(c, axis=1)
                row["along_response"] = "varies" if spread.max() > 1e-9 else "constant"
    return row


def audit_group_setting(s: KLGroupSetting) -> dict[str, Any]:
    """Every group of ``G`` token-MDP responses: the framework's advantages against ours on the
    KL-shaped reward, and the KL's share of the exact expected GRPO gradient."""
    from grpo_theory import compute_advantages

    w = worlds()["token_mdp"]
    groups, mult = kl.joint_groups(w.logp.shape[0], GROUP_SIZE, ordered=False)
    r = w.rewards[groups]
    old, ref = w.logp[groups], w.ref[groups]
    psi = w.scores.sum(axis=1)
    k = kl.kl_estimate(w.logp - w.ref, estimator=s.estimator).sum(axis=1)[groups]  # type: ignore[arg-type]
    out: dict[str, Any] = {"setting": s.setting, "estimator": s.estimator, "ours": s.ours[0],
                           "ours_options": s.ours[1], "default": s.default,
                           "groups": int(mult.sum()), "group_size": GROUP_SIZE}
    g = {}
    for beta in (0.0, BETA):
        A_fw = np.asarray(s.advantages(r, old, ref, beta), dtype=np.float64)
        A_ours = np.asarray(compute_advantages(s.ours[0], r - beta * k, **s.ours[1]))
        d = float(np.max(np.abs(A_fw - A_ours)))
        out[f"max_abs_diff_advantages_beta{beta:g}"] = d
        out["agree"] = out.get("agree", True) and d <= RTOL * max(float(np.abs(A_ours).max()), 1)
        g[beta] = kl.expected_group_gradient(A_fw, groups, probs=w.probs, psi=psi,
                                             multiplicity=mult)
    out["token_mdp_on_policy"] = _class((g[0.0] - g[BETA]) / BETA, w.targets())
    return out


# --- the audit ------------------------------------------------------------------------------------
def load_kl_options(framework: str, tree: SourceTree, dtype: str) -> KLOptions:
    """The framework module's :class:`KLOptions`."""
    import importlib

    try:
        module = importlib.import_module(f"framework_checks.kl_{framework}")
        return module.kl_options(tree, dtype)
    except (FrameworkCodeError, ImportError, SyntaxError, NameError, AttributeError,
            KeyError) as exc:
        raise FrameworkCodeError(f"{framework} {tree.version}: cannot load its KL code: "
                                 f"{type(exc).__name__}: {exc}") from exc


def audit_kl(framework: str, source: str | SourceTree | None = None, *, dtype: str = "float32",
             options: KLOptions | None = None) -> dict[str, Any]:
    """Every KL option of ``framework`` at the gradient level (JSON-ready). ``source``: as
    :func:`~framework_checks.source.find_source` takes it, or a :class:`SourceTree` already read;
    ``options``: the framework's :class:`KLOptions` when already loaded from the same source."""
    from .adapter import torch_dtype

    tree = source if isinstance(source, SourceTree) else find_source(framework, source)
    opts = load_kl_options(framework, tree, dtype) if options is None else options
    rows = [audit_setting(s, torch_dtype(dtype)) for s in opts.settings]
    groups = [audit_group_setting(s) for s in opts.groups]
    return {"framework": framework, "version": tree.version, "beta": BETA, "dtype": dtype,
            "rtol": RTOL, "defaults": opts.defaults, "rows": rows, "group_rows": groups,
            "conclusion": conclusion(rows, groups)}


# --- words ----------------------------------------------------------------------------------------
_WORDS = {
    "reverse_sequence": "grad KL(pi||pi_ref)",
    "forward_sequence": "grad KL(pi_ref||pi)",
    "reverse_token": "per-token reverse KL (partial)",
    "forward_token": "per-token forward KL (partial)",
    "zero": "zero",
    "mix": "biased mix",
}


def describe(cls: dict[str, Any] | None, *, one_token: bool = False) -> str:
    """A classification in words (``"0.75 x grad KL(pi||pi_ref)"``, ``"biased mix (cos 0.83)"``)."""
    if cls is None:
        return "-"
    if cls["label"] == "framework raises":
        return "framework raises"
    lab = cls["label"]
    if one_token and lab in ("reverse_sequence", "forward_sequence"):
        text = "reverse KL" if lab == "reverse_sequence" else "forward KL"
    else:
        text = _WORDS[lab]
    if lab == "mix":
        return f"{text} (cos {cls['cos_reverse']:.2f})"
    if lab != "zero" and abs(cls["scale"] - 1.0) > 1e-6:
        text = f"{cls['scale']:.3g} x {text}"
    return text


def _cell(text: str) -> str:
    """``text`` for a Markdown table cell (``|`` escaped)."""
    return text.replace("|", "\\|")


def _model_words(m: dict[str, Any]) -> str:
    if not m:
        return "no per-token form (e.g. an exact KL over the vocabulary)"
    est = m["estimator"]
    pl = m["placement"]
    lvl = m.get("level", "token")
    text = {"loss": f"{est} in the loss", "loss_k2_gradient": f"{est} value, k2 gradient",
            "loss_ratio_weighted": f"{est} x ratio in the loss",
            "loss_is_k2": f"{est} value, ratio-weighted k2 gradient",
            "reward": f"{est} in the reward (own token)",
            "reward_to_go": f"{est} in the reward, summed to go",
            "reward_sum": f"{est} in the reward, summed over the response"}[pl]
    if m.get("ratio_level") == "sequence":
        text += " (sequence ratio)"
    if m.get("stale"):
        text += " (from pi_old, ratio-weighted)"
    return text + ("" if lvl == "token" else ", sequence level")


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def conclusion(rows: list[dict[str, Any]], groups: list[dict[str, Any]]) -> str:
    """What the table says, in words, generated from its rows (on-policy token MDP first)."""
    by: dict[str, list[str]] = {}
    for r in [*rows, *groups]:
        lab = r.get("token_mdp_on_policy", {}).get("label", "mix")
        by.setdefault(lab, []).append(f"`{r['setting']}`")
    said = {
        "reverse_sequence": "the gradient of the sequence-level reverse KL KL(pi||pi_ref), the "
        "regulariser of J - beta KL",
        "reverse_token": "only the per-token (partial) reverse-KL gradient: exact for one token, "
        "but it ignores how a token changes the later tokens' distributions",
        "forward_sequence": "the gradient of the forward KL KL(pi_ref||pi)",
        "forward_token": "the per-token forward-KL gradient (KL(pi_ref(.|s)||pi(.|s))): the "
        "other direction",
        "zero": "zero expected gradient: no regularisation, only noise",
        "mix": "a gradient that is none of these (a biased mix)",
    }
    parts = []
    for lab, words in said.items():
        if lab in by:
            verb = "gives" if len(by[lab]) == 1 else "give"
            parts.append(f"{_join(by[lab])} {verb} {words}")
    if "framework raises" in by:
        parts.append(f"{_join(by['framework raises'])} "
                     f"{'raises' if len(by['framework raises']) == 1 else 'raise'}")
    text = "On-policy in the token MDP, " + "; ".join(parts) + "."
    off = [f"`{r['setting']}`" for r in rows
           if r.get("token_mdp_off_policy", {}).get("label") == "reverse_sequence"]
    text += (" With samples from a stale pi_old, " + (
        f"{_join(off)} still give grad KL(pi||pi_ref)" if off
        else "no option gives grad KL(pi||pi_ref) at pi") + ".")
    for d in [r for r in [*rows, *groups] if r.get("default")]:
        text += (f" Default once KL is on: `{d['setting']}` gives "
                 f"{describe(d['token_mdp_on_policy'])} in the token MDP.")
    return text


def render_kl_markdown(report: dict[str, Any]) -> str:
    """The KL table of one framework, its group rows and its conclusion."""
    n_battery = report["rows"][0]["total"] if report["rows"] else 0
    out = [f"\n#### KL options of {report['framework']} {report['version']} at the gradient "
           f"level (beta = {report['beta']:g})\n",
           "coefficient c_t of the token score grad log pi(y_t): the framework's (autograd of its "
           f"KL term / (beta w_i)) against grpo_theory.kl on {n_battery} battery inputs"
           f"  ({report['dtype']}; agree: <= {report['rtol']:g} x max|ours|). "
           "Expected gradient of the KL term over every response of each world (float64), "
           "against grad KL(pi||pi_ref); off-policy: samples from pi_old, target at pi.\n",
           "| setting | what it is | c_t agrees | bandit | token MDP | token MDP, off-policy | "
           "cos to grad KL(pi\\|\\|pi_ref) | c_t along a response |",
           "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        bad = [b for b in r["battery"] if b["status"] != "agree"]
        agree = f"{r['agree']}/{r['total']}"
        if bad:
            b = bad[0]
            d = b.get("max_abs_diff")
            agree += f" ({b['status']}: {b['case']}" + (
                f", max diff {d:.2g})" if isinstance(d, float) else ")")
        tm = r.get("token_mdp_on_policy", {})
        cos = f"{tm['cos_reverse']:.3f}" if "cos_reverse" in tm else "-"
        name = f"`{r['setting']}`" + (" (default)" if r["default"] else "")
        out.append(f"| {name} | {_model_words(r['model'])} | {_cell(agree)} | "
                   f"{_cell(describe(r.get('bandit_on_policy'), one_token=True))} | "
                   f"{_cell(describe(tm))} | {_cell(describe(r.get('token_mdp_off_policy')))} | "
                   f"{cos} | {r.get('along_response', '-')} |")
    if report["group_rows"]:
        out += ["", f"KL in the sequence reward of the GRPO advantage (every group of "
                f"{report['group_rows'][0]['group_size']} token-MDP responses, "
                f"{report['group_rows'][0]['groups']} groups): the KL's share of the expected "
                "gradient, (E[g](0) - E[g](beta)) / beta.\n",
                "| setting | grpo_theory | advantages agree (max abs diff) | token MDP | cos to "
                "grad KL(pi\\|\\|pi_ref) |", "|---|---|---|---|---|"]
        for g in report["group_rows"]:
            d = max(v for k, v in g.items() if k.startswith("max_abs_diff_advantages"))
            tm = g["token_mdp_on_policy"]
            name = f"`{g['setting']}`" + (" (default)" if g["default"] else "")
            out.append(f"| {name} | {g['ours']} {g['ours_options']} | "
                       f"{'yes' if g['agree'] else 'no'} ({d:.2g}) | {_cell(describe(tm))} | "
                       f"{tm['cos_reverse']:.3f} |")
    if report["defaults"]:
        out += ["", "Defaults read from the source: " + ", ".join(
            f"`{k}` = `{v!r}`" for k, v in report["defaults"].items()) + "."]
    out += ["", f"**Conclusion.** {report['conclusion']}", ""]
    return "\n".join(out)


def docs_markdown(report: dict[str, Any]) -> str:
    """The compact table of ``docs/kl.md`` for one framework (what each option's KL term
    delivers; the command's table has the battery and the cosines), and the conclusion."""
    out = ["| setting | what it is | one token (bandit) | token MDP | token MDP, off-policy |",
           "|---|---|---|---|---|"]
    for r in report["rows"]:
        name = f"`{r['setting']}`" + (" (default)" if r["default"] else "")
        out.append(f"| {name} | {_model_words(r['model'])} | "
                   f"{_cell(describe(r.get('bandit_on_policy'), one_token=True))} | "
                   f"{_cell(describe(r.get('token_mdp_on_policy')))} | "
                   f"{_cell(describe(r.get('token_mdp_off_policy')))} |")
    for g in report["group_rows"]:
        name = f"`{g['setting']}`" + (" (default)" if g["default"] else "")
        out.append(f"| {name} | {g['estimator']} summed into the sequence reward, then "
                   f"{g['ours']} | - | {_cell(describe(g['token_mdp_on_policy']))} | - |")
    return "\n".join(out) + f"\n\n{report['conclusion']}\n"
