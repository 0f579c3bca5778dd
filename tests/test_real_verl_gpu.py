"""verl adapter on a CUDA GPU (marker ``gpu``; skipped without CUDA or verl), one process, NCCL.

verl's FSDP2 engine as verl runs it on GPUs: float32 master weights with bf16 compute and float32
gradient reduction (``compute_dtype="bf16"``), and float32 throughout as on CPU. Attention:

* ``sdpa``, packed micro-batches (``use_remove_padding=True``, rows of different lengths): the
  attention kernel is whichever SDPA picks for the packed rows' block mask;
* ``flash``, padded micro-batches of rows without padding (``use_remove_padding=False``, every
  row the same length: the model needs no mask and runs causal attention) inside
  ``sdpa_kernel([SDPBackend.FLASH_ATTENTION])``: PyTorch's FlashAttention-2 kernel and no other
  (a step that needed another kernel would raise).

The reference is the CPU tests' (``tests/verl_harness.py``): float64 rows of a Hugging Face copy
of the engine's weights, one backward per rollout of ``sum_t u_it log pi`` with verl's own
per-token loss gradient ``u``. Tolerances:

* float32: as on CPU, ``1e-5`` (sum of the rows vs verl's gradient, the Gram vs the rows' Gram);
* bf16: verl's own bf16 gradient is ``e_engine`` away from the float64 sum of the rows; the
  geometry's Gram must be within ``H.BF16_GRAM_FACTOR * e_engine + 1e-3`` of the float64 rows'
  Gram (a Gram doubles a relative error of its rows: factor 4 leaves room for the geometry's
  own bf16 products), and ``e_engine`` within ``H.BF16_ENGINE_RTOL`` (bf16 has 8 mantissa bits:
  ``2^-8 = 0.4%`` per product).

Run: ``python -m pytest -m gpu tests/test_real_verl_gpu.py -s`` (prints each case's errors and
the attention kernel).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # before the heavier imports below
    pytest.skip("needs a CUDA GPU: run `python -m pytest -m gpu` on a machine with one",
                allow_module_level=True)
pytest.importorskip("verl")

import verl_harness as H  # noqa: E402

from real_model.integrations import config as gconfig  # noqa: E402
from real_model.integrations import verl as iverl  # noqa: E402
from real_model.integrations.verl import cpu as vc  # noqa: E402
from real_model.integrations.verl import step as verl_step  # noqa: E402

FP32_TOL = 1e-5
FP32_ROWS_GRAD_RTOL = 1e-6  # weight_grads="rows": dW summed over rows, another float32 order
HIDDEN = 256  # head dimension 64 (4 heads): every SDPA kernel takes it

# (compute dtype, attention): packed or padded micro-batches, rows of one length, flash only
CASES: dict[tuple[str, str], dict[str, Any]] = {
    ("fp32", "sdpa"): {"remove_padding": True, "uniform": False, "flash": False},
    ("bf16", "sdpa"): {"remove_padding": True, "uniform": False, "flash": False},
    ("bf16", "flash"): {"remove_padding": False, "uniform": True, "flash": True},
}
LOSSES = [("vanilla", "token-mean"), ("gspo", "seq-mean-token-mean"), ("cispo", "token-mean")]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    vc.init_process_group()
    path = vc.save_tiny_llama(tmp_path_factory.mktemp("verl_gpu") / "tiny", hidden=HIDDEN)
    return {"path": path, "built": {}}


def _engine(engines: dict, dtype: str, attention: str) -> Any:
    key = (dtype, attention)
    if key not in engines["built"]:
        case = CASES[key]
        engines["built"][key] = vc.make_engine(
            engines["path"], micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
            geometry=gconfig.GeometryConfig(), use_remove_padding=case["remove_padding"],
            compute_dtype=dtype)
    return engines["built"][key]


def _data(path: Any, case: dict[str, Any]) -> Any:
    kw = {"min_prompt": 5, "min_response": 7} if case["uniform"] else {}
    td = vc.grpo_batch(H.REWARDS, seed=1, logp_noise=0.3, model_path=path, **kw)
    return vc.rank_slice(td, 0, 1, micro_batch_size=4, use_remove_padding=case["remove_padding"])


def _attention(flash: bool) -> Any:
    """Only PyTorch's flash kernel (``flash``), else SDPA's own choice."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if flash else contextlib.nullcontext()


@pytest.mark.parametrize(("loss_mode", "agg"), LOSSES)
@pytest.mark.parametrize(("dtype", "attention"), list(CASES))
def test_rows_and_gram_on_gpu_are_as_exact_as_verl_own_gradient(engines, dtype, attention,
                                                                loss_mode, agg):
    case = CASES[(dtype, attention)]
    engine = _engine(engines, dtype, attention)
    # the flash case measures the in-run Gram only: the score Gram's second pass packs rows
    # (a block mask, which the flash kernel does not take); the sdpa cases run it every step
    engine.geometry = verl_step.VerlGeometry(
        gconfig.GeometryConfig(score_every=0 if case["flash"] else 1))
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4, loss_mode=loss_mode,
                              loss_agg_mode=agg)
    data = _data(engines["path"], case)
    with _attention(case["flash"]):
        res = H.check_step(engine, engines["path"], data, loss_fn, with_grad=True)
    assert "failed" not in res, res.get("failed")
    e_engine, e_gram = res["sum_err"], max(res["gram_err"].values())
    engine.geometry = None  # the same step without the geometry: verl's gradient alone
    off = _plain_grad(engine, data, loss_fn, res["names"], case["flash"])
    e_off = H.rel_err(res["engine_grad"], off)
    print(f"\n[verl gpu] {torch.cuda.get_device_name(0)} {dtype} {attention} {loss_mode} {agg}: "
          f"engine gradient vs float64 rows {e_engine:.2e}, Gram vs float64 rows' Gram "
          f"{e_gram:.2e}, gradient with vs without geometry {e_off:.2e}, "
          f"paths {sorted(set(res['paths'].values()))}")
    assert set(res["paths"].values()) == {"in_run"}
    if dtype == "fp32":
        assert e_engine <= FP32_TOL and e_gram <= FP32_TOL, (e_engine, e_gram)
        assert e_off <= FP32_ROWS_GRAD_RTOL, e_off
    else:
        assert e_engine <= H.BF16_ENGINE_RTOL and e_off <= H.BF16_ENGINE_RTOL, (e_engine, e_off)
        assert e_gram <= H.BF16_GRAM_FACTOR * e_engine + 1e-3, (e_engine, e_gram)


def _plain_grad(engine: Any, data: Any, loss_fn: Any, names: list[str], flash: bool) -> Any:
    with _attention(flash):
        grads, _ = H.measured_step(engine, data, loss_fn)
    return H.flat_grad(grads, names)


def test_flash_case_runs_only_the_flash_kernel(engines):
    """The ``flash`` case's step cannot fall back to another kernel: with only the flash backend
    allowed, a masked attention call raises (checked here on a masked call)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 4, 8, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(8, 8, device="cuda", dtype=torch.bool).tril()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


@pytest.mark.parametrize(("loss_mode", "agg"), LOSSES[:1])
def test_bf16_rows_path_on_gpu_is_as_exact_as_verl_own_gradient(engines, monkeypatch, loss_mode,
                                                               agg):
    """bf16 Linears on ``weight_grads="rows"`` on CUDA (``gram.rows.ROWS_LOW_PRECISION_DEVICE_
    TYPES``, CPU only by default until measured): float32 rows straight from the bf16 operands
    (``out_dtype``), verl's ``dW`` their sum rounded once; as exact as the tap path."""
    from dataclasses import replace

    from real_model.gram import rows

    monkeypatch.setattr(rows, "ROWS_LOW_PRECISION_DEVICE_TYPES", ("cpu", "cuda"))
    assert rows.float32_products(torch.zeros(1, device="cuda", dtype=torch.bfloat16))
    case = CASES[("bf16", "sdpa")]
    engine = _engine(engines, "bf16", "sdpa")

    def per_sample(module, *, engine, **kw):  # every Linear on the per-sample (rows) path
        return verl_step.new_capture(module, engine=replace(engine, linear_method="per_sample"),
                                     **kw)

    engine.geometry = verl_step.VerlGeometry(
        gconfig.GeometryConfig(score_every=0, batch_small_calls=False), capture_factory=per_sample)
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4, loss_mode=loss_mode,
                              loss_agg_mode=agg)
    data = _data(engines["path"], case)
    res = H.check_step(engine, engines["path"], data, loss_fn, with_grad=True)
    assert "failed" not in res, res.get("failed")
    assert all(mb.capture.from_rows for mb in engine.geometry.micro)
    e_engine, e_gram = res["sum_err"], max(res["gram_err"].values())
    engine.geometry = None
    e_off = H.rel_err(res["engine_grad"], _plain_grad(engine, data, loss_fn, res["names"], False))
    print(f"\n[verl gpu] bf16 rows path: engine gradient vs float64 rows {e_engine:.2e}, Gram "
          f"{e_gram:.2e}, gradient with vs without geometry {e_off:.2e}")
    assert e_engine <= H.BF16_ENGINE_RTOL and e_off <= H.BF16_ROWS_GRAD_RTOL, (e_engine, e_off)
    assert e_gram <= H.BF16_GRAM_FACTOR * e_engine + 1e-3, (e_engine, e_gram)
