"""``real_model.gram.small_terms``: the batched terms of small calls equal each pass's per-row Gram.

Tier: exact (float64; the reference forms every row's gradient explicitly)."""

from __future__ import annotations

import torch

from real_model.gram.packed import PackedRows
from real_model.gram.small_terms import PassCalls, add_small_calls

F64 = torch.float64


def layout(lengths: list[int]) -> PackedRows:
    return PackedRows(torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]),
                      torch.device("cpu"))


def rows_of(lay: PackedRows, t: torch.Tensor) -> list[torch.Tensor]:
    """Each row's tokens of ``t`` ``[N, ...]``."""
    return [t[a:b] for a, b in lay.bounds]


def reference(p: PassCalls, vocab: int) -> torch.Tensor:
    """The pass's ``[n, n]`` Gram from explicit per-row gradients of every call."""
    g: list[list[torch.Tensor]] = [[] for _ in range(p.n)]
    for lay, a, d in p.linear:
        for i, (ai, di) in enumerate(zip(rows_of(lay, a), rows_of(lay, d), strict=True)):
            g[i].append((di.T @ ai).reshape(-1))  # dW_i = sum_t delta_t a_t^T
    for lay, ids, d, keep in p.embedding:
        k = torch.ones_like(ids, dtype=torch.bool) if keep is None else keep
        for i, (ii, di, ki) in enumerate(zip(rows_of(lay, ids), rows_of(lay, d),
                                             rows_of(lay, k), strict=True)):
            E = torch.zeros(vocab, d.shape[-1], dtype=F64).index_add_(0, ii[ki], di[ki])
            g[i].append(E.reshape(-1))
    for lay, d, z in p.norms:
        for i, (di, zi) in enumerate(zip(rows_of(lay, d), rows_of(lay, z), strict=True)):
            g[i].append((di * zi).sum(0))
    for r in p.rows:
        for i in range(p.n):
            g[i].append(r[i])
    G = torch.stack([torch.cat(x) for x in g])
    return G @ G.T


def random_pass(lengths: list[int], *, seed: int, skip_head: bool = False,
                pad_id: int | None = None) -> PassCalls:
    """Calls as a tiny model's: q/k/v on one input (shared memory), o, a head (optional), an
    embedding (ids in [0, 6), ``pad_id`` left out), two norms and a leaf's rows."""
    gen = torch.Generator().manual_seed(seed)
    lay = layout(lengths)
    N, n = lay.tokens, lay.n

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=F64)

    x = r(N, 3)
    p = PassCalls(n, [torch.zeros(2, 2, dtype=F64), torch.zeros(n - 2, n - 2, dtype=F64)],
                  [slice(0, 2), torch.arange(2, n).flip(0)])
    p.linear += [(lay, x, r(N, 3)), (lay, x, r(N, 2)), (lay, x, r(N, 2)), (lay, r(N, 3), r(N, 3))]
    if not skip_head:
        p.linear.append((lay, r(N, 3), r(N, 5)))
    ids = torch.randint(0, 6, (N,), generator=gen)
    p.embedding.append((lay, ids, r(N, 3), None if pad_id is None else ids != pad_id))
    p.norms += [(lay, r(N, 3), r(N, 3)), (lay, r(N, 3), r(N, 3))]
    p.rows.append(r(n, 4))
    return p


def test_each_pass_gets_its_own_per_row_gram_whatever_its_length_and_calls():
    """Three passes of different token counts (padding to the longest), one without the head
    (a slot left empty), one with a padding id: each pass's blocks are those of its own
    per-row Gram, to float64 rounding; the other passes' tokens never enter it."""
    passes = [random_pass([3, 1, 4, 2], seed=1), random_pass([5, 2, 2], seed=2, skip_head=True),
              random_pass([1, 1, 6, 3, 2], seed=3, pad_id=2)]
    want = [reference(p, vocab=6) for p in passes]
    add_small_calls(passes, chunk_size=1 << 20)
    for p, K in zip(passes, want, strict=True):
        for idx, Kb in zip(p.index, p.K, strict=True):
            ref = K[idx][:, idx] if isinstance(idx, torch.Tensor) else K[idx, idx]
            assert torch.allclose(Kb, ref, rtol=1e-12, atol=1e-12)


def test_passes_added_together_or_one_by_one_agree_and_small_chunks_change_nothing():
    together = [random_pass([3, 4], seed=5), random_pass([2, 2, 1], seed=6)]
    alone = [random_pass([3, 4], seed=5), random_pass([2, 2, 1], seed=6)]
    add_small_calls(together, chunk_size=1)  # one slot at a time
    for p in alone:
        add_small_calls([p], chunk_size=1 << 20)
    for a, b in zip(together, alone, strict=True):
        for Ka, Kb in zip(a.K, b.K, strict=True):
            assert torch.allclose(Ka, Kb, rtol=1e-12, atol=1e-14)


def test_a_pass_whose_rows_lie_on_two_layouts_sums_both():
    """Batch-first calls of two token counts per row (two layouts of the same rows) add up."""
    gen = torch.Generator().manual_seed(7)
    short, long = layout([2, 2]), layout([3, 3])
    a1, d1, a2 = (torch.randn(n, 2, generator=gen, dtype=F64) for n in (4, 4, 6))
    d2 = torch.randn(6, 3, generator=gen, dtype=F64)
    p = PassCalls(2, [torch.zeros(2, 2, dtype=F64)], [slice(0, 2)],
                  linear=[(short, a1, d1), (long, a2, d2)])
    want = reference(p, vocab=1)
    add_small_calls([p], chunk_size=1 << 20)
    assert torch.allclose(p.K[0], want, rtol=1e-12, atol=1e-12)


def test_nothing_kept_adds_nothing():
    K = torch.zeros(2, 2, dtype=F64)
    add_small_calls([PassCalls(2, [K], [slice(0, 2)])], chunk_size=16)
    assert not K.any()
