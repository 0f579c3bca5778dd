"""The PAPER'S printed values of Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like
Training: A Critical Perspective", arXiv 2503.20783 v1), typed in once, here only.

Nothing here is a result of ours: the numbers are as the paper prints them (v1, read from the
PDF in the authors' repository, digest ``shared/papers/dr-grpo-2503.20783.md``). Data only.
"""

from __future__ import annotations

__all__ = [
    "PAPER_ID",
    "TABLE5_MEAN_LENGTH_CHARS",
    "NO_TEMPLATE_AVERAGE_GAIN",
    "NO_TEMPLATE_GAIN_TEXT",
    "OAT_ZERO_7B",
]

PAPER_ID = ("arXiv 2503.20783 v1 (Understanding R1-Zero-Like Training: A Critical Perspective; "
            "Dr. GRPO)")

#: App. D, Table 5: average response length in characters on 500 MATH questions (R1 template,
#: truncated responses excluded): response type -> (DeepSeek-V3-Base, DeepSeek-R1-Zero).
TABLE5_MEAN_LENGTH_CHARS: dict[str, tuple[float, float]] = {
    "unformatted": (880.7, 7870.3),
    "correct": (621.3, 4965.4),
    "incorrect": (1038.9, 8206.1),
}

#: Sec. 2.2 / Table 1 of the paper: five-benchmark average of Qwen2.5-Math base models, 4-shot
#: prompting -> no template: model -> (4-shot, no template).
NO_TEMPLATE_AVERAGE_GAIN: dict[str, tuple[float, float]] = {
    "Qwen2.5-Math-1.5B": (19.7, 33.1),
    "Qwen2.5-Math-7B": (23.8, 38.2),
}
#: How the paper describes that gain.
NO_TEMPLATE_GAIN_TEXT = "about 60%"

#: Abstract / Sec. 1: Oat-Zero-7B (Qwen2.5-Math-7B, Dr. GRPO, MATH level 3-5, Qwen-Math template).
OAT_ZERO_7B: dict[str, float] = {
    "aime2024_accuracy_percent": 43.3,
    "five_benchmark_average": 51.4,
    "training_hours": 27.0,
    "a100_gpus": 8.0,
}
