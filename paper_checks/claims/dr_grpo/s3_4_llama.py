"""Dr. GRPO (arXiv 2503.20783) Sec. 3.4: the Llama experiments (empirical, not decidable here)."""

from __future__ import annotations

from paper_checks.registry import CheckContext, Outcome, claim

SECTION = "Dr. GRPO Sec. 3.4: Llama experiments"


@claim(
    "drgrpo_fig8_llama_double_increase", kind="empirical",
    location="Sec. 3.4, Results; Fig. 8 (right)",
    text="With Llama-3.2-3B (math-pretrained variants, R1 template) GRPO shows a \"double "
    "increase\" (accuracy and response length rise together) that could be misread as long "
    "chain-of-thought emerging although the length increase may come from the optimisation "
    "bias; Dr. GRPO reduces it.",
    check="Not decidable here: needs the Llama training runs. The mechanism (GRPO lengthening "
    "incorrect responses, Dr. GRPO not) is checked in toy worlds by "
    "drgrpo_sec3_1_length_bias_token_mdp and drgrpo_fig6_length_growth_mechanism.",
)
def _fig8(ctx: CheckContext) -> Outcome:
    return Outcome("inconclusive", {"model": "Llama-3.2-3B (math-pretrained variants)",
                                    "printed_numbers": 0},
                   correction="decided by training the Llama models with GRPO and Dr. GRPO "
                   "from the same checkpoints (several seeds) and separating the length growth "
                   "of correct and incorrect responses",
                   short="needs the Llama training runs")
