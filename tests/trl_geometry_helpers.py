"""Shared helpers of the TRL geometry tests: a tiny tokenizer and float64 Llama, a parity reward,
prompts, a ``GeometryGRPOTrainer`` factory, the loss types of the default and slow tiers, and
:class:`RowChecker`, which checks each step's rows against TRL's own accumulated gradient.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from real_model.integrations import trl as itrl
from real_model.integrations.trl import weights as trl_weights


def tiny_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 +-=?.,:$'\n")
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_model(vocab_size: int, *, seed: int = 0, tie: bool = True, eos_logit: float = 0.0,
               dropout: float = 0.0, attn: str = "eager"):
    """Tiny float64 Llama; ``eos_logit`` raises the mean end-of-sequence logit (varied lengths).

    ``attn="eager"`` is ~3x faster at this size but gives NaN on left-padded prompts in float64:
    use it with prompts of one length (:data:`PROMPTS`), ``"sdpa"`` with padded prompts.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=tie,
        attention_dropout=dropout, attn_implementation=attn,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float64)
    if eos_logit:
        g = torch.Generator().manual_seed(seed + 1)
        ids = torch.randint(2, vocab_size, (16, 12), generator=g)
        with torch.no_grad():
            mu = model.model(input_ids=ids).last_hidden_state.reshape(-1, 16).mean(0)
            model.get_output_embeddings().weight[1] = eos_logit * mu / mu.dot(mu)
    return model


def tiny_model_with_hub_path(path, *, dtype=torch.float64):
    """The tiny model (``eos_logit=1``) saved under ``path`` and reloaded, so that TRL can build
    the reference model from its ``name_or_path`` (``beta > 0``)."""
    from transformers import LlamaForCausalLM

    tok = tiny_tokenizer()
    tiny_model(len(tok), eos_logit=1.0).save_pretrained(path)
    return LlamaForCausalLM.from_pretrained(path, dtype=dtype)


def perturb_reference_model(trainer, *, scale: float = 0.05, seed: int = 3) -> None:
    """Move TRL's reference model away from the policy (seeded), so that the KL term of a
    ``beta > 0`` loss and its gradient are nonzero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainer.ref_model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


@functools.cache
def simulated_vllm_trainer():
    """A ``GeometryGRPOTrainer`` with TRL's vLLM importance-sampling correction but no vLLM:
    generation by the trainer's model, then seeded sampler ratios ``exp(0.3 z)`` per completion
    token, which TRL's loss multiplies in (set ``vllm_importance_sampling_correction = True`` on
    the trainer). Built on first use: this module imports without TRL."""

    class SimulatedVLLMTrainer(itrl.GeometryGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            self.use_vllm = False
            try:
                out = super()._generate_and_score_completions(inputs)
            finally:
                self.use_vllm = True
            g = torch.Generator().manual_seed(int(self.state.global_step))
            shape = out["completion_ids"].shape
            out["importance_sampling_ratio"] = torch.exp(
                0.3 * torch.randn(shape, generator=g, dtype=torch.float64)).float()
            return out

    return SimulatedVLLMTrainer


def parity_reward(completions, **kw):
    """Deterministic 0/1 reward that mixes groups of random completions."""
    return [float(sum(map(ord, c)) % 2 == 0) for c in completions]


PROMPTS = ["1+2=", "3+4=", "5+1=", "2+2="] * 8  # one length: no prompt padding (eager attention)
PADDED_PROMPTS = ["1+2=", "3+44=", "15+1=", "2+2="] * 8  # left-padded prompts (sdpa)


def make_trainer(tmp_path, *, geometry=None, seed=0, model=None, tokenizer=None, prompts=None,
                 trainer_cls=None, callbacks=None, peft_config=None, **cfg):
    """A GeometryGRPOTrainer (default: the tiny float64 model with varied lengths)."""
    from datasets import Dataset

    tok = tokenizer or tiny_tokenizer()
    model = model if model is not None else tiny_model(len(tok), seed=seed, eos_logit=1.0)
    ds = Dataset.from_dict({"prompt": prompts or PROMPTS})
    kw = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
        gradient_accumulation_steps=2, num_generations=4, max_completion_length=8,
        max_steps=1, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
        temperature=0.9, seed=seed, learning_rate=1e-2, bf16=False,  # TRL defaults to bf16
        max_grad_norm=0.0, activation_checkpointing=False,
        geometry_jsonl_path=str(tmp_path / "geometry.jsonl"),
    )
    if "gradient_checkpointing" in cfg:  # transformers 5.24's name (the old one warns)
        cfg["activation_checkpointing"] = cfg.pop("gradient_checkpointing")
    kw.update(cfg)
    args = itrl.GeometryGRPOConfig(**kw)
    cls = trainer_cls or itrl.GeometryGRPOTrainer
    extra = {} if geometry is None else {"geometry": geometry}
    return cls(model=model, reward_funcs=parity_reward, args=args, train_dataset=ds,
               processing_class=tok, callbacks=callbacks or [], peft_config=peft_config,
               **extra)


def _flat_grads(params):
    return torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1)
                      for p in params]).double()


def _weighted_grads(trainer, gen, rows, weights, params, *, per_row=True):
    """``grad sum_t weights[r, t] log pi_rt`` with TRL's own log-probs: ``[n, d]`` (one row each)
    or, with ``per_row=False``, ``[1, d]`` (the sum over the rows, one backward)."""
    b = gen.batch
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
    am = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
    C = b["completion_ids"].shape[1]
    sels = [[r] for r in rows] if per_row else [list(rows)]
    out = torch.empty(len(sels), sum(p.numel() for p in params), dtype=torch.float64)
    for k, sel in enumerate(sels):  # filled in place: a row is a whole model's gradient
        for p in params:
            p.grad = None
        lp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids[sel], am[sel], C)
        (lp * weights[sel].to(lp.dtype)).sum().backward()
        out[k] = _flat_grads(params)
    return out


class RowChecker:
    """``on_pre_optimizer_step``: the step's rows against TRL's accumulated gradient.

    ``per_row``: also check the recorded Grams against explicit per-row gradients.
    ``hand_route``: also compare ``u`` with ``-c A m`` of :func:`trl_row_weights`.
    """

    def __init__(self, *, per_row: bool = True, hand_route: bool = False):
        from transformers import TrainerCallback

        checker = self

        class _CB(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
                checker.check(state.global_step)

        self.callback = _CB()
        self.trainer = None
        self.per_row = per_row
        self.hand_route = hand_route
        self.results: list[dict] = []

    def check(self, step: int) -> None:
        tr = self.trainer
        last = tr.geometry_last
        assert last is not None and last["step"] == step, "the step was not measured"
        params = [p for p in tr.model.parameters() if p.requires_grad]
        trl_grad = _flat_grads(params)
        saved = [None if p.grad is None else p.grad.clone() for p in params]
        total = torch.zeros_like(trl_grad)
        res = {"step": step, "K_err": 0.0, "Kg_err": 0.0, "lengths": [], "u_err": 0.0}
        by_group: dict[int, list] = {}
        G = int(tr.num_generations)
        for seg in last["segments"]:
            gen, rows, U = seg["generation"], seg["rows"], seg["token_weights"]
            lm = gen.batch["completion_mask"].double()
            g = _weighted_grads(tr, gen, rows, U, params, per_row=self.per_row)
            total += g.sum(dim=0)
            res["lengths"] += lm[rows].sum(dim=1).int().tolist()
            if self.per_row:
                psi = _weighted_grads(tr, gen, rows, lm, params)
                for k, r in enumerate(rows):
                    if float(lm[r].sum()) > 0:
                        key = gen.group_offset + (gen.first_row + int(r)) // G
                        by_group.setdefault(key, []).append((g[k], psi[k]))
            if self.hand_route:
                res["u_err"] = max(res["u_err"], self._hand_route(tr, gen, seg))
        for p, s in zip(params, saved, strict=True):
            p.grad = s
        if self.per_row:
            self._check_grams(last, by_group, res)
        res["rel_err"] = float((total - trl_grad).norm() / trl_grad.norm())
        self.results.append(res)

    @staticmethod
    def _check_grams(last, by_group, res):
        """Recorded ``K`` / ``Kg`` of every measured group against ``Psi Psi^T`` / ``g g^T``
        (entry by entry: no stacked copy of rows that hold a whole model's gradient each)."""
        assert last["grams"], "no group was measured"

        def gram(rows: list) -> np.ndarray:
            G = np.empty((len(rows), len(rows)))
            for i, a in enumerate(rows):
                for j in range(i, len(rows)):
                    G[i, j] = G[j, i] = float(a @ rows[j])
            return G

        for key, K in last["grams"].items():
            refK = gram([x[1] for x in by_group[key]])
            refKg = gram([x[0] for x in by_group[key]])
            res["K_err"] = max(res["K_err"], float(np.abs(K - refK).max() / np.abs(refK).max()))
            Kg = last["row_grams"][key]
            scale = max(np.abs(refKg).max(), 1e-300)
            res["Kg_err"] = max(res["Kg_err"], float(np.abs(Kg - refKg).max() / scale))

    @staticmethod
    def _hand_route(tr, gen, seg):
        """max |u + c A m| / max |u| with ``c`` of :func:`trl_row_weights` (ratio 1, beta 0)."""
        B = gen.batch["completion_ids"].shape[0]
        chunk_of = np.zeros(B, dtype=np.int64)
        for j, rows in enumerate(gen.chunk_rows):
            chunk_of[rows] = j
        m = gen.batch["completion_mask"].double()
        c = trl_weights.trl_row_weights(
            m.sum(dim=1).numpy(), chunk_of, loss_type=tr.loss_type,
            num_chunks=len(gen.chunk_rows),
            gradient_accumulation_steps=tr.current_gradient_accumulation_steps,
            num_processes=tr.accelerator.num_processes,
            num_items_in_batch=float(gen.batch["num_items_in_batch"]),
            max_completion_length=tr.max_completion_length, epsilon_high=tr.epsilon_high)
        ref = -torch.as_tensor(c * gen.advantages)[:, None] * m
        rows = seg["rows"]
        U = seg["token_weights"]
        return float((U[rows] - ref[rows]).abs().max() / U[rows].abs().max())


# the four normaliser families in the default tier; the other loss types and variants (GSPO,
# reward scaling) in the slow tier (CI runs both)
_slow = pytest.mark.slow
LOSSES = [
    ("grpo", {}), ("bnpo", {}), ("dr_grpo", {}), ("dapo", {}),
    pytest.param("luspo", {"importance_sampling_level": "sequence"}, marks=_slow),
    pytest.param("sapo", {}, marks=_slow),
    pytest.param("cispo", {"epsilon_high": 0.5}, marks=_slow),
    pytest.param("vespo", {}, marks=_slow),
    pytest.param("grpo", {"importance_sampling_level": "sequence"}, marks=_slow),
    pytest.param("dapo", {"scale_rewards": "batch"}, marks=_slow),
    pytest.param("dr_grpo", {"scale_rewards": "none"}, marks=_slow),
]


def loss_id(p):
    lt, e = p.values if hasattr(p, "values") else p
    return f"{lt}-{'-'.join(f'{k}={v}' for k, v in e.items())}"
