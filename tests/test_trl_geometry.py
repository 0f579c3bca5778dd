"""TRL integration: our row weights and Grams against TRL's own ``compute_loss`` gradient.

At an on-policy step with ``beta = 0``, the gradient of TRL's loss (summed over the
micro-batches of one optimizer step) must equal ``-sum_i w_i psi_i`` with ``w_i = c_i A_i`` from
:func:`real_model.trl_geometry.trl_row_weights`, and ``w^T K w`` must equal its squared norm.
``psi_i`` are computed from TRL's own per-token log-probabilities (its fused LM head), row by row;
``K`` from :func:`real_model.gram.trajectory_gram` (exact engine) through our ``group_gram``.
Tiny float64 Llama built from a config, character tokenizer built offline; CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from real_model import trl_geometry as tg  # noqa: E402

# float64 model, but TRL's fused LM head keeps float32 log-sum-exp statistics and returns float32
# log-probabilities: TRL's own psi_i carry ~1e-7 relative error, hence 1e-5.
RTOL = 1e-5


def tiny_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 +-=?.,:$'\n")
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_model(vocab_size: int, *, seed: int = 0, tie: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(torch.float64)


def parity_reward(completions, **kw):
    """Deterministic 0/1 reward that mixes groups of random completions."""
    return [float(sum(map(ord, c)) % 2 == 0) for c in completions]


def make_trainer(tmp_path, *, geometry=None, seed=0, model=None, tokenizer=None, prompts=None,
                 **cfg):
    """A GeometryGRPOTrainer (default: the tiny float64 model and tokenizer, parity reward)."""
    from datasets import Dataset

    tok = tokenizer or tiny_tokenizer()
    model = model if model is not None else tiny_model(len(tok), seed=seed)
    ds = Dataset.from_dict({"prompt": prompts or ["1+2=", "3+44=", "5+1=", "2+2="] * 8})
    kw = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
        gradient_accumulation_steps=2, num_generations=4, max_completion_length=6,
        max_steps=1, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
        temperature=0.9, seed=seed, learning_rate=1e-3, bf16=False,  # TRL defaults to bf16 autocast
    )
    kw.update(cfg)
    args = trl.GRPOConfig(**kw)
    return tg.GeometryGRPOTrainer(
        model=model, reward_funcs=parity_reward, args=args, train_dataset=ds,
        processing_class=tok,
        geometry=geometry or tg.GeometryConfig(jsonl_path=str(tmp_path / "geometry.jsonl")),
    )


def trl_step(trainer):
    """One generation batch through the geometry hooks, then TRL's accumulated gradient."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    batch = next(iter(trainer.get_train_dataloader()))
    trainer._prepare_inputs(batch)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    for chunk in trainer._buffered_inputs:
        assert "geometry_row" not in chunk
        trainer.compute_loss(trainer.model, chunk).backward()
    return torch.cat([p.grad.reshape(-1) for p in params]).double(), params


def trl_scores(trainer, params):
    """psi_i from TRL's own per-token log-probabilities, one row at a time: ``[B, d]``."""
    b = trainer.geometry_last["batch"]
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
    am = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
    C = b["completion_ids"].shape[1]
    rows = []
    for i in range(ids.shape[0]):
        lp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids[i : i + 1], am[i : i + 1], C
        )
        s = (lp * b["completion_mask"][i : i + 1]).sum()
        g = torch.autograd.grad(s, params, allow_unused=True)
        flat = [(torch.zeros_like(p) if x is None else x).reshape(-1)
                for x, p in zip(g, params, strict=True)]
        rows.append(torch.cat(flat).double())
    return torch.stack(rows)


LOSSES = [
    ("grpo", {}), ("bnpo", {}), ("dr_grpo", {}), ("dapo", {}),
    ("luspo", {"importance_sampling_level": "sequence"}), ("sapo", {}),
    ("cispo", {"epsilon_high": 0.5}), ("vespo", {}),
    ("grpo", {"importance_sampling_level": "sequence"}),  # GSPO
    ("dapo", {"scale_rewards": "batch"}), ("dr_grpo", {"scale_rewards": "none"}),
]


@pytest.mark.parametrize("loss_type,extra", LOSSES,
                         ids=[f"{lt}-{'-'.join(f'{k}={v}' for k, v in e.items())}"
                              for lt, e in LOSSES])
def test_rows_sum_to_trl_gradient_and_wKw_equals_its_squared_norm(tmp_path, loss_type, extra):
    tr = make_trainer(tmp_path, loss_type=loss_type, **extra)
    grad, params = trl_step(tr)
    last = tr.geometry_last
    w = last["c"] * last["advantages"]
    assert np.any(w != 0), "the batch needs a mixed group (change the seed)"
    psi = trl_scores(tr, params)
    ours = -(torch.as_tensor(w) @ psi)
    scale = float(grad.norm())
    assert scale > 0
    assert float((ours - grad).norm()) <= RTOL * scale
    # per group: our exact Gram equals Psi Psi^T of TRL's scores
    G = tr.num_generations
    for g, K in last["grams"].items():
        P = psi[g * G : (g + 1) * G]
        ref = (P @ P.T).numpy()
        np.testing.assert_allclose(K, ref, rtol=RTOL, atol=RTOL * np.abs(ref).max())
    # w^T K w over the whole batch (cross-group block from Psi) equals ||TRL grad||^2
    Kfull = (psi @ psi.T).numpy()
    for g, K in last["grams"].items():
        Kfull[g * G : (g + 1) * G, g * G : (g + 1) * G] = K
    np.testing.assert_allclose(float(w @ Kfull @ w), float(grad @ grad), rtol=RTOL)
    # the per-group gradient norm logged is sqrt(w_g^T K_g w_g); the process's is ||TRL grad||
    rec = tr.geometry_records[-1]
    assert rec["grad_norm_per_process"][0] == pytest.approx(scale, rel=RTOL)
    assert rec["exact_structure"] and rec["loss_type"] == loss_type
    measured = [gr for gr in rec["group_records"] if "weights" in gr]
    assert len(measured) == len(last["grams"]) >= 1
    for gr in rec["group_records"]:
        if "weights" not in gr:  # all advantages 0: no Gram computed, no gradient
            assert not np.any(gr["advantages"]) and gr["group"] not in last["grams"]
            continue
        K = last["grams"][gr["group"]]
        wg = np.asarray(gr["weights"])
        assert gr["grad_norm"] == pytest.approx(float(np.sqrt(wg @ K @ wg)), rel=1e-12)


def test_every_trl_loss_type_is_known():
    """Every loss_type TRL's _compute_loss accepts has a row-weight rule here."""
    import inspect

    src = inspect.getsource(trl.GRPOTrainer._compute_loss)
    import re

    names = set()
    for m in re.finditer(r'loss_type (?:==|in) (\[[^\]]*\]|"[a-z_]+")', src):
        names |= set(re.findall(r'"([a-z_]+)"', m.group(1)))
    assert names == set(tg.SUPPORTED_LOSS_TYPES)


def beta_trainer(tmp_path, **kw):
    """A trainer whose CONFIG says beta=0.1 (what the geometry reads); TRL itself runs beta=0,
    since a config-built model has no hub id to load the reference model from."""
    tr = make_trainer(tmp_path, loss_type="grpo", **kw)
    tr.args.beta = 0.1
    return tr


def test_structure_issues_names_each_breaking_option():
    args = trl.GRPOConfig(output_dir="/tmp/x", beta=0.04, top_entropy_quantile=0.5,
                          entropy_coef=0.01, steps_per_generation=4,
                          gradient_accumulation_steps=2, use_cpu=True, report_to=[])
    text = " | ".join(tg.structure_issues(args))
    for key in ("beta=0.04", "top_entropy_quantile", "entropy bonus", "steps_per_generation=4"):
        assert key in text
    ok = trl.GRPOConfig(output_dir="/tmp/x", use_cpu=True, report_to=[], num_iterations=2)
    assert tg.structure_issues(ok) == []
    assert "first inner step" in " ".join(tg.structure_notes(ok))
    assert "token-level" in " ".join(tg.structure_issues(ok, advantages_dim=2))


def test_beta_breaks_structure_and_weight_metrics_are_not_reported(tmp_path):
    tr = beta_trainer(tmp_path)
    with pytest.warns(UserWarning, match="beta=0.1"):
        trl_step(tr)
    rec = tr.geometry_records[-1]
    assert not rec["exact_structure"]
    assert any("beta" in s for s in rec["issues"])
    assert any("norms" in g for g in rec["group_records"])  # score geometry still reported
    for g in rec["group_records"]:
        assert "effective_rank" not in g and "weights" not in g


def test_strict_mode_raises_on_broken_structure(tmp_path):
    tr = beta_trainer(tmp_path, geometry=tg.GeometryConfig(strict=True))
    with pytest.raises(ValueError, match="beta"):
        trl_step(tr)


def test_training_logs_geometry_through_trainer_log_and_jsonl(tmp_path):
    import json

    tr = make_trainer(tmp_path, loss_type="dapo", max_steps=3, gradient_accumulation_steps=1,
                      per_device_train_batch_size=8,
                      geometry=tg.GeometryConfig(geometry_every=2,
                                                 jsonl_path=str(tmp_path / "g.jsonl")))
    tr.train()
    lines = [json.loads(x) for x in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 2]
    logged = [h for h in tr.state.log_history if "geometry/groups" in h]
    assert len(logged) == 2 and all(h["geometry/groups"] == 2.0 for h in logged)
    with_er = [h for h in logged if "geometry/effective_rank/mean" in h]
    for h, r in zip(with_er, [r for r in lines if r["mixed_groups"]], strict=True):
        assert h["geometry/effective_rank/mean"] == pytest.approx(
            r["metrics"]["effective_rank"]["mean"])


def test_trl_row_weights_hand_checked():
    # grpo: two micro-batches of 2 rows, GA=2, W=1: c = 1/(2*2*L)
    c = tg.trl_row_weights([1, 2, 4, 4], [0, 1, 0, 1], loss_type="grpo", num_chunks=2,
                           gradient_accumulation_steps=2, num_processes=1)
    assert c.tolist() == [1 / 4, 1 / 8, 1 / 16, 1 / 16]
    # bnpo: tokens per micro-batch 5 and 6
    c = tg.trl_row_weights([1, 2, 4, 4], [0, 1, 0, 1], loss_type="bnpo", num_chunks=2,
                           gradient_accumulation_steps=2, num_processes=1)
    assert c.tolist() == [1 / 10, 1 / 12, 1 / 10, 1 / 12]
    # dapo over 2 processes: S/(GA N) regardless of W
    c = tg.trl_row_weights([1, 3], [0, 0], loss_type="dapo", num_chunks=1,
                           gradient_accumulation_steps=1, num_processes=2, num_items_in_batch=8)
    assert c.tolist() == [1 / 8, 1 / 8]
    with pytest.raises(ValueError, match="not supported"):
        tg.trl_row_weights([1], [0], loss_type="ppo", num_chunks=1,
                           gradient_accumulation_steps=1, num_processes=1)


def test_cos_success_failure_hand_checked():
    K = np.array([[1.0, 0.5], [0.5, 1.0]])
    assert tg.cos_success_failure(K, [True, False]) == pytest.approx(0.5)
    assert tg.cos_success_failure(K, [True, True]) is None


def test_trl_train_writes_real_train_outputs_and_compare_accepts_them(tmp_path):
    """``run_trl_train`` end to end on the tiny model (the command does the same with SmolLM2)."""
    import json

    from real_model.compare import run_compare
    from real_model.loading import LoadedModel, ModelSpec
    from real_model.trl_train import TRLTrainConfig, run_trl_train

    tok = tiny_tokenizer()
    loaded = LoadedModel(model=tiny_model(len(tok)), tokenizer=tok,
                         spec=ModelSpec(name="tiny", path="-"), device="cpu", dtype="float64")
    cfg = TRLTrainConfig(steps=2, prompts_per_step=2, num_generations=4, max_new_tokens=6,
                         shots=1, lr=1e-3, loss_type="grpo")
    res = run_trl_train(tmp_path / "run", cfg, loaded=loaded, progress=False,
                        reward_fn=lambda text, gold: float(len(text) % 2 == 0))
    out = tmp_path / "run"
    for name in ("steps.jsonl", "geometry.jsonl", "results.json", "table.md", "train.png"):
        assert (out / name).is_file(), name
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1] and res["steps_done"] == 2
    assert all("4" in s["spectra"] for s in steps)
    assert res["experiment"] == "real_trl_train" and res["summary"][0]["R"] == 4
    cmp_ = run_compare(tmp_path / "cmp", real=out / "results.json", R_values=(4,))
    assert any(r["source"] == "real:tiny" for r in cmp_["rows"])
    with pytest.raises(FileExistsError, match="overwrite"):
        run_trl_train(out, cfg, loaded=loaded, progress=False)
