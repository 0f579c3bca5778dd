"""The KL options of the frameworks at the gradient level (framework_checks.kl_*), run through
the frameworks' own code.

TRL runs from the installed package (skipped without it). verl 0.9.1 and OpenRLHF 0.11.2 run from
their wheels (``GRPO_AUDIT_WHEELS``, as in ``test_framework_checks_equivalence.py``); their full
KL audits are in the slow tier."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from framework_checks import kl_audit
from framework_checks.kl_source import argparse_default, dataclass_default, module_constant
from framework_checks.source import FrameworkCodeError, SourceTree, find_source
from grpo_theory import kl


@pytest.fixture(scope="module")
def trl_code():
    """TRL's code executed once for the module (the installed package)."""
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed")
    from framework_checks.trl import TrlCode

    return TrlCode(find_source("trl"), "float64")


@pytest.fixture(scope="module")
def trl_options(trl_code):
    from framework_checks import kl_trl

    return kl_trl.kl_options(find_source("trl"), "float32", code=trl_code)


def _wheel(name: str) -> str:
    d = os.environ.get("GRPO_AUDIT_WHEELS")
    if not d:
        pytest.skip(f"set GRPO_AUDIT_WHEELS to a directory with the {name} wheel")
    hits = sorted(Path(d).glob(f"{name}-*.whl"))
    if not hits:
        pytest.fail(f"no {name}-*.whl in GRPO_AUDIT_WHEELS={d}")
    return str(hits[-1])


# --- reading defaults from source -----------------------------------------------------------------
def test_defaults_are_read_from_the_source_text():
    src = ("from dataclasses import dataclass, field\n@dataclass\nclass C:\n    a: float = 0.5\n"
           "    b: str = field(default='x', metadata={})\n")
    assert dataclass_default(src, "C", "a") == 0.5 and dataclass_default(src, "C", "b") == "x"
    cli = "p.add_argument('--k', default='k1')\np.add_argument('--f', action='store_true')\n"
    assert argparse_default(cli, "--k") == "k1" and argparse_default(cli, "--f") is False
    assert module_constant("CLIP = 10.0\n", "CLIP") == 10.0
    with pytest.raises(FrameworkCodeError, match="field c not found"):
        dataclass_default(src, "C", "c")
    with pytest.raises(FrameworkCodeError, match="option --x not found"):
        argparse_default(cli, "--x")


def test_a_missing_kl_file_is_named(tmp_path):
    from framework_checks.source import FILES

    assert "verl/trainer/ppo/ray_trainer.py" in FILES["verl"]  # read with the rest of the tree
    tree = SourceTree("verl", {}, str(tmp_path), "0")
    with pytest.raises(FrameworkCodeError, match="ray_trainer.py not found in"):
        tree.text("verl/trainer/ppo/ray_trainer.py")


# --- TRL, from the installed package --------------------------------------------------------------
def _setting(opts, default_only: bool):
    return next(s for s in opts.settings if s.default == default_only)


def test_trl_defaults_and_its_default_kl_term(trl_options):
    """TRL 1.16: k3 per token times the differentiable token ratio (use_bias_correction_kl
    defaults to True): the per-token (partial) reverse-KL gradient; without the ratio, the
    per-token forward KL."""
    opts = trl_options
    d = opts.defaults
    assert set(d) == {"beta", "loss_type", "use_bias_correction_kl", "importance_sampling_level"}
    if importlib.metadata.version("trl") == "1.16.0":
        assert (d["beta"], d["loss_type"], d["use_bias_correction_kl"]) == (0.0, "dapo", True)
    import torch

    for s, label in ((_setting(opts, True), "reverse_token"),
                     (next(s for s in opts.settings if s.model["placement"] == "loss"),
                      "forward_token")):
        row = kl_audit.audit_setting(s, torch.float32)
        assert [b["status"] for b in row["battery"]][:2] == ["agree", "agree"], row["battery"]
        assert row["token_mdp_on_policy"]["label"] == label
        assert row["along_response"] == "varies"


def test_trl_per_token_weights_are_the_regularised_grpo_weights(trl_code):
    """The full TRL loss (advantages and beta both on): d loss / d logp_it = -(w_i (A_i - beta
    c_it)) with grpo_theory's aggregation weights and KL coefficients, for loss types of every
    aggregation; a wrong beta does not match (the check can fail)."""
    import torch

    from framework_checks.adapter import completion_masks
    from framework_checks.trl import CONFIG_DEFAULTS, loss_inputs
    from grpo_theory.conventions import TRL_LOSS_AGGREGATION

    code = trl_code
    rng = np.random.default_rng(0)
    L = np.array([4, 1, 3, 2])
    T = 4
    logp = np.log(rng.uniform(0.1, 0.9, (4, T)))
    ref = logp + rng.normal(0, 0.5, (4, T))
    A = np.array([1.0, -0.5, 0.3, -1.2])
    beta = 0.2
    for lt in ("dapo", "grpo", "bnpo"):
        lp = torch.tensor(logp, requires_grad=True)
        mask = completion_masks(L, T).double()
        args = types.SimpleNamespace(**{**CONFIG_DEFAULTS, "use_bias_correction_kl": True})
        s = code.trainer(lp, beta=beta, loss_type=lt, args=args)
        inputs = loss_inputs(lp, mask, torch.tensor(A), num_items_in_batch=mask.sum(),
                             ref_per_token_logps=torch.tensor(ref),
                             old_per_token_logps=lp.detach())
        (g,) = torch.autograd.grad(code.grpo_methods["_compute_loss"](s, None, inputs), lp)
        c = kl.kl_coefficients(logp - ref, estimator="k3", placement="loss_ratio_weighted",
                               mask=np.arange(T)[None, :] < L[:, None])
        mode = TRL_LOSS_AGGREGATION[lt][0]
        ours = kl.regularised_token_weights(A[None], L[None], c[None], beta=beta, mode=mode)[0]
        np.testing.assert_allclose(-g.numpy(), ours, atol=1e-12, err_msg=lt)
        wrong = kl.regularised_token_weights(A[None], L[None], c[None], beta=2 * beta,
                                             mode=mode)[0]
        assert np.abs(-g.numpy() - wrong).max() > 1e-3


def test_a_wrong_model_shows_as_a_battery_discrepancy(trl_options):
    """Planted error: the TRL default setting set against k3 as a plain loss differs on every
    battery input."""
    opts = trl_options
    import torch

    s = replace(_setting(opts, True), model={"estimator": "k3", "placement": "loss"})
    row = kl_audit.audit_setting(s, torch.float64)
    assert {b["status"] for b in row["battery"]} == {"differs"}


def test_conclusion_is_generated_from_the_rows():
    rows = [{"setting": "A", "token_mdp_on_policy": {"label": "zero"}, "default": True},
            {"setting": "B", "token_mdp_on_policy": {"label": "forward_token"}},
            {"setting": "C", "token_mdp_on_policy": {"label": "forward_token"},
             "token_mdp_off_policy": {"label": "reverse_sequence"}}]
    text = kl_audit.conclusion(rows, [])
    assert "`A` gives zero expected gradient" in text
    assert "`B` and `C` give the per-token forward-KL gradient" in text
    assert "`C` still give grad KL(pi||pi_ref)" in text
    assert "Default once KL is on: `A` gives zero" in text


# --- the full audits (slow) -----------------------------------------------------------------------
@pytest.mark.slow
def test_trl_kl_table_is_rendered_with_its_conclusion():
    pytest.importorskip("trl")
    rep = kl_audit.audit_kl("trl")
    md = kl_audit.render_kl_markdown(rep)
    assert "#### KL options of trl" in md and "**Conclusion.**" in md
    assert len(rep["rows"]) == 4 and not rep["group_rows"]


@pytest.mark.slow
def test_verl_kl_options_from_its_wheel():
    rep = kl_audit.audit_kl("verl", _wheel("verl"))
    by = {r["setting"].split("kl_loss_type=")[-1]: r for r in rep["rows"]}
    assert by["low_var_kl"]["default"] and by["low_var_kl"]["token_mdp_on_policy"]["label"] == \
        "forward_token"
    assert by["kl"]["token_mdp_on_policy"]["label"] == "zero"
    assert by["mse"]["token_mdp_on_policy"]["label"] == "reverse_token"
    for plus in ("k1+", "abs+", "low_var_kl+"):
        assert by[plus]["token_mdp_on_policy"]["label"] == "reverse_token"
    assert by["full"]["token_mdp_on_policy"]["label"] == "framework raises"
    # the clamps of kl_penalty's k3 show on the large log-ratios
    assert by["low_var_kl"]["agree"] == 2
    groups = {g["setting"]: g for g in rep["group_rows"]}
    drgrpo = next(g for s, g in groups.items() if "norm_adv_by_std_in_grpo=False" in s)
    assert drgrpo["agree"] and drgrpo["token_mdp_on_policy"]["label"] == "reverse_sequence"
    assert drgrpo["token_mdp_on_policy"]["scale"] == pytest.approx(0.75, abs=1e-9)
    default = next(g for g in rep["group_rows"] if g["default"])
    assert default["token_mdp_on_policy"]["label"] == "mix"


@pytest.mark.slow
def test_openrlhf_kl_options_from_its_wheel():
    rep = kl_audit.audit_kl("openrlhf", _wheel("openrlhf"))
    by = {r["setting"]: r for r in rep["rows"]}
    d = by["--algo.kl.estimator k1 (in the reward)"]
    assert d["default"] and d["token_mdp_on_policy"]["label"] == "reverse_sequence"
    assert by["--algo.kl.use_loss --algo.kl.estimator k3"]["token_mdp_on_policy"]["label"] == \
        "forward_token"
    for est in ("k1", "k2", "k3"):
        r = by[f"--algo.kl.use_loss --algo.kl.estimator {est} --algo.kl.unbiased_gradient"]
        assert r["agree"] == r["total"]
        assert r["token_mdp_on_policy"]["label"] == "reverse_token"
    assert rep["defaults"]["KL_IS_WEIGHT_CLIP"] == 10.0


# --- docs/kl.md's tables are the audit's ----------------------------------------------------------
DOCS = Path(__file__).resolve().parents[1] / "docs" / "kl.md"


def _docs_block(framework: str) -> str:
    text = DOCS.read_text(encoding="utf-8")
    start = f"<!-- kl-table:{framework} (generated; do not edit) -->\n"
    end = f"<!-- /kl-table:{framework} -->"
    assert start in text and end in text, f"docs/kl.md has no {framework} block"
    return text.split(start, 1)[1].split(end, 1)[0]


def test_docs_trl_table_is_the_audits(trl_options):
    if importlib.metadata.version("trl") != "1.16.0":
        pytest.skip("docs/kl.md documents TRL 1.16.0")
    rep = kl_audit.audit_kl("trl", options=trl_options)
    assert _docs_block("trl") == kl_audit.docs_markdown(rep)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["verl", "openrlhf"])
def test_docs_wheel_tables_are_the_audits(framework):
    rep = kl_audit.audit_kl(framework, _wheel(framework))
    assert _docs_block(framework) == kl_audit.docs_markdown(rep)
