"""What the audit found, ranked: REPORT.md's first screen, computed from the claims' outcomes.

Nothing here is typed in per claim: the bottom line, the key findings and the counts are built from
each claim's computed verdict, its ``kind`` (:data:`paper_checks.registry.KINDS`) and the one-line
``headline`` its check wrote (``Outcome.finding``, else its short correction or conditions).

**Consequence order** (:func:`consequence_key`): by verdict (refuted, then holds only under
unstated conditions, then undecided, then holds); within a verdict by kind tier (:data:`KIND_TIER`:
the paper's mathematics and measurements, then its readings, then "as practised" variants, then
printed values and references); within a tier, claims the paper puts in its abstract,
contributions or conclusion (:func:`is_headline`) before the rest; then report order.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from .papers import DEFAULT_PAPER, Paper
from .registry import KINDS, VERDICTS, ClaimResult

__all__ = ["KIND_TIER", "VERDICT_ORDER", "consequence_key", "ranked", "is_headline",
           "kind_verdict_counts", "bottom_line", "key_findings", "anchor_link"]

#: Verdicts from the most to the least consequential for a reader of the paper.
VERDICT_ORDER: dict[str, int] = {"refuted": 0, "holds-with-conditions": 1, "inconclusive": 2,
                                 "holds": 3}
#: Kinds by how much rests on them: the paper's mathematics and measurements first, printed values
#: and references (which a reader corrects in place) last.
KIND_TIER: dict[str, int] = {"derivation": 0, "empirical": 0, "interpretation": 1,
                             "as-practised": 2, "printed-value": 3, "reference": 3}
#: Kinds listed one claim per line in the key findings; the others are one line per kind.
_ONE_LINE_TIERS = (0, 1, 2)
_HEADLINE = re.compile(r"\b(abstract|contributions?|conclusions?)\b", re.IGNORECASE)

_KIND_PLURAL = {"derivation": "derivations", "empirical": "empirical claims",
                "interpretation": "interpretations", "as-practised": "\"as practised\" variants",
                "printed-value": "printed values", "reference": "references"}


def is_headline(r: ClaimResult) -> bool:
    """The paper states the claim in its abstract, contributions or conclusion (its location
    says so)."""
    return bool(_HEADLINE.search(r.location))


def consequence_key(r: ClaimResult, order: int = 0) -> tuple[int, int, int, int]:
    """Sort key of the consequence order (module docstring); ``order`` is the report position."""
    return (VERDICT_ORDER[r.verdict], KIND_TIER[r.kind], 0 if is_headline(r) else 1, order)


def ranked(results: Sequence[ClaimResult]) -> list[ClaimResult]:
    """``results`` in consequence order."""
    return [r for _, r in sorted(enumerate(results), key=lambda t: consequence_key(t[1], t[0]))]


def anchor_link(cid: str) -> str:
    """A Markdown link to the claim's entry in REPORT.md."""
    return f"[`{cid}`](#{cid})"


def _one(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _sentence(text: str) -> str:
    text = _one(text)
    return text if text.endswith((".", "?", "!")) else text + "."


def kind_verdict_counts(results: Sequence[ClaimResult]) -> list[str]:
    """Markdown table: one row per kind present (in :data:`KINDS` order), one column per verdict,
    with totals."""
    c = Counter((r.kind, r.verdict) for r in results)
    kinds = [k for k in KINDS if any(r.kind == k for r in results)]
    lines = ["| kind | " + " | ".join(VERDICTS) + " | total |",
             "|---|" + "---:|" * (len(VERDICTS) + 1)]
    for k in kinds:
        row = [c.get((k, v), 0) for v in VERDICTS]
        lines.append(f"| {k} | " + " | ".join(str(n) for n in row) + f" | {sum(row)} |")
    tot = [sum(c.get((k, v), 0) for k in kinds) for v in VERDICTS]
    lines.append("| **total** | " + " | ".join(f"**{n}**" for n in tot) + f" | **{sum(tot)}** |")
    return lines


def _count_words(items: Sequence[ClaimResult]) -> str:
    """``"15 derivations, 1 empirical, 2 interpretations"``: counts by kind, in tier order."""
    c = Counter(r.kind for r in items)
    return ", ".join(f"{n} {_KIND_PLURAL[k] if n > 1 else k}" for k, n in
                     sorted(c.items(), key=lambda kv: (KIND_TIER[kv[0]], list(KINDS).index(kv[0]))))


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def bottom_line(spec: Paper, results: Sequence[ClaimResult], *, real_run: str | None = None
                ) -> list[str]:
    """A few sentences from the counts and the top-ranked findings (a Markdown paragraph)."""
    n = len(results)
    c = Counter(r.verdict for r in results)
    top = ranked(results)
    refuted = [r for r in top if r.verdict == "refuted"]
    lines = [f"Of the {_n(n, 'claim', 'claims')} checked, {_n(c['holds'], 'holds', 'hold')} as "
             "written, "
             f"{_n(c['holds-with-conditions'], 'holds', 'hold')} only under conditions the paper "
             f"does not state, {_n(c['refuted'], 'is', 'are')} refuted and "
             f"{_n(c['inconclusive'], 'cannot', 'cannot')} be decided here."]
    major = [r for r in refuted if KIND_TIER[r.kind] < 2]
    minor = [r for r in refuted if KIND_TIER[r.kind] >= 2]
    if major:
        lead = major[:3]
        lines.append(
            f"{len(major)} of the refutations {'is' if len(major) == 1 else 'are'} in the paper's "
            f"mathematics, measurements or readings ({_count_words(major)}); ranked first: "
            + "; ".join(f"{anchor_link(r.id)} ({_one(r.location).split(';')[0]})" for r in lead)
            + ".")
    if minor:
        lines.append(f"The other {_n(len(minor), 'refutation is', 'refutations are')} "
                     f"{_count_words(minor)}.")
    if not refuted:
        cond = [r for r in top if r.verdict == "holds-with-conditions"]
        lines.append("Nothing is refuted" + (
            f"; the most consequential qualification: {anchor_link(cond[0].id)} "
            f"({_one(cond[0].headline)})." if cond else "."))
    undecided = [r for r in results if r.verdict == "inconclusive"]
    if undecided:
        lines.append(f"Undecided here: {_count_words(undecided)} (each says what would decide "
                     "it).")
    if real_run:
        lines.append(real_run)
    return [" ".join(lines)]


def _finding_line(i: int, r: ClaimResult) -> str:
    real = (f" On the real-model run ({r.real_run['run']['model']}): **{r.real_run['verdict']}**."
            if r.real_run else "")
    return (f"{i}. **{_one(r.location)}** ({r.kind}). The paper: {_sentence(r.claim)} "
            f"Computed: {_sentence(r.headline or r.verdict)}{real} {anchor_link(r.id)}")


def _grouped_line(label: str, items: Sequence[ClaimResult], of: int) -> str:
    return (f"- **{label}** ({len(items)} of {of} checked): "
            + ", ".join(anchor_link(r.id) for r in items))


def key_findings(results: Sequence[ClaimResult]) -> list[str]:
    """The ``## Key findings`` lines: refutations ranked (one line each for the paper's
    mathematics, measurements, readings and "as practised" variants; one line per kind for
    printed values and references), then the unstated conditions, the undecided claims and what
    holds."""
    top = ranked(results)
    by_kind = Counter(r.kind for r in results)
    out = ["## Key findings", "",
           "Ranked by consequence: refutations first (the paper's mathematics and measurements, "
           "then its readings, then variants used in practice, then printed values and "
           "references; within each, what the abstract, contributions or conclusion state "
           "first). Each line: where, what the paper says, what the computation gives, the "
           "claim's entry.", ""]
    i = 0
    for verdict, title in (("refuted", "Refuted"),
                           ("holds-with-conditions", "Holds only under conditions the paper "
                            "does not state"),
                           ("inconclusive", "Undecided here")):
        items = [r for r in top if r.verdict == verdict]
        if not items:
            continue
        out += [f"**{title}** ({len(items)})", ""]
        for r in items:
            if KIND_TIER[r.kind] in _ONE_LINE_TIERS:
                i += 1
                out.append(_finding_line(i, r))
        grouped = [r for r in items if KIND_TIER[r.kind] not in _ONE_LINE_TIERS]
        if grouped and any(KIND_TIER[r.kind] in _ONE_LINE_TIERS for r in items):
            out.append("")
        for kind in KINDS:
            ks = [r for r in grouped if r.kind == kind]
            if ks:
                out.append(_grouped_line(_KIND_PLURAL[kind].capitalize(), ks, by_kind[kind]))
        out.append("")
    holds = [r for r in top if r.verdict == "holds"]
    if holds:
        head = [r for r in holds if is_headline(r) and KIND_TIER[r.kind] < 2]
        out += [f"**Holds as written** ({len(holds)}: {_count_words(holds)})"
                + (": among them, from the abstract, contributions or conclusion, "
                   + ", ".join(anchor_link(r.id) for r in head) if head else "") + ".", ""]
    return out


def paper_sentence(spec: Paper) -> str:
    """What "the paper" means in the report: its arXiv id, title, scope and provenance."""
    role = (" (the seed paper: the one grpo-audit was built to audit, `--paper "
            f"{spec.key}`, the default)" if spec.key == DEFAULT_PAPER
            else f" (`--paper {spec.key}`)")
    scope = f"; audited: {spec.scope}" if spec.scope else ""
    prov = f" Provenance: {spec.provenance}" if spec.provenance else ""
    return (f"**The paper:** arXiv {spec.arxiv}, \"{spec.title}\"{role}{scope}. Below, \"the "
            f"paper\" is always this paper, and each claim is our paraphrase of its statement "
            f"at the location given.{prov}")
