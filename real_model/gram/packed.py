"""Rows packed into one sequence (remove-padding micro-batches), and their layouts."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PackedRows"]


class PackedRows:
    """Rows packed into one sequence (``segments``: cumulative lengths, as ``cu_seqlens``).

    Remove-padding trainers (flash-attention varlen) run a
    micro-batch of ``n`` rows as ONE sequence ``[1, N, ...]`` with ``N = segments[-1]`` tokens
    (possibly followed by padding), row ``i`` holding tokens ``segments[i]:segments[i + 1]``;
    attention stays within a row. :meth:`unpack` lays a packed tensor out batch-first,
    ``[n, T_max, ...]``, zeros where a row has no token: padded positions carry zero input and
    zero gradient, so the per-row identities add nothing there (exact).
    """

    def __init__(self, segments: Any, device: torch.device) -> None:
        seg = ([int(s) for s in segments] if isinstance(segments, (list, tuple)) else
               [int(s) for s in torch.as_tensor(segments).detach().reshape(-1).cpu().tolist()])
        lengths = [b - a for a, b in zip(seg[:-1], seg[1:], strict=True)]
        if len(seg) < 2 or seg[0] != 0 or min(lengths) < 0:
            raise ValueError("segments must be cumulative row lengths [0, l_0, l_0 + l_1, ...] "
                             f"(non-decreasing, from 0, at least one row), got {seg}")
        self.n = len(lengths)
        self.tokens = seg[-1]
        self.T = max(1, max(lengths))
        self.device = device
        self._row: torch.Tensor | None = None
        self.bounds = list(zip(seg[:-1], seg[1:], strict=True))
        self._index: torch.Tensor | None = None
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None
        self._indicators: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._blocks: dict[tuple[Any, ...], tuple[slice | torch.Tensor, torch.Tensor]] = {}

    @property
    def row(self) -> torch.Tensor:
        """``[N]``: the row of each packed token (formed at first use)."""
        if self._row is None:
            lengths = torch.tensor([t1 - t0 for t0, t1 in self.bounds], dtype=torch.long)
            self._row = torch.repeat_interleave(torch.arange(self.n), lengths).to(self.device)
        return self._row

    @property
    def index(self) -> torch.Tensor:
        """Packed token ``p`` of row ``i`` -> its padded ``[n, T]`` position ``i T + (p -
        start_i)`` (formed at first use: batched small calls never unpack)."""
        if self._index is None:
            row = self.row.cpu()
            start = torch.tensor([a for a, _ in self.bounds], dtype=torch.long)
            self._index = (row * self.T + torch.arange(self.tokens) - start[row]).to(self.device)
        return self._index

    def is_packed(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is one packed sequence ``[1, >= N, ...]`` of these rows."""
        return x.dim() >= 2 and x.shape[0] == 1 and x.shape[1] >= self.tokens

    def unpack_shared(self, t: torch.Tensor) -> torch.Tensor:
        """:meth:`unpack`, reusing the last result when ``t`` is the same memory (modules that
        share one input, e.g. the q/k/v projections, complete one after the other)."""
        last = self._last
        if last is not None:
            src, out = last
            if (src.data_ptr() == t.data_ptr() and src.shape == t.shape and src.dtype == t.dtype
                    and src.stride() == t.stride() and src._version == t._version):
                return out  # ``src`` is held: its memory cannot be another tensor's now
        out = self.unpack(t)
        self._last = (t, out)
        return out

    def indicator(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``S`` ``[n, N]``: ``S_it = 1`` when packed token ``t`` is row ``i``'s (kept per dtype
        and device)."""
        key = (dtype, device)
        S = self._indicators.get(key)
        if S is None:
            S = torch.zeros(self.n, self.tokens, dtype=dtype, device=device)
            for i, (t0, t1) in enumerate(self.bounds):
                S[i, t0:t1] = 1
            self._indicators[key] = S
        return S

    def block(self, rows: slice | torch.Tensor,
              device: torch.device) -> tuple[slice | torch.Tensor, torch.Tensor]:
        """The packed tokens of the rows ``rows`` and their indicator ``S_b`` (float64
        ``[n_b, N_b]``, :meth:`indicator` restricted to them), kept per block and device.

        ``rows``: a ``slice`` of consecutive rows (their tokens: one ``slice``) or a
        ``LongTensor`` of row indices (their tokens in that order: a ``LongTensor``; likewise
        a ``slice`` with a step).
        """
        key = ((rows.start, rows.stop, rows.step) if isinstance(rows, slice)
               else tuple(rows.tolist()), device)
        hit = self._blocks.get(key)
        if hit is not None:
            return hit
        ids = list(range(self.n))[rows] if isinstance(rows, slice) else list(key[0])
        spans = [self.bounds[r] for r in ids]
        tok: slice | torch.Tensor
        if isinstance(rows, slice) and rows.step in (None, 1) and ids:
            tok = slice(spans[0][0], spans[-1][1])
        else:
            tok = torch.cat([torch.arange(t0, t1) for t0, t1 in spans]
                            or [torch.zeros(0, dtype=torch.long)]).to(device)
        full = self.indicator(torch.float64, device)
        S = full[ids][:, tok].contiguous()  # the rows' own tokens: the rest of the row is 0
        self._blocks[key] = (tok, S)
        return tok, S

    def row_sums(self, t: torch.Tensor) -> torch.Tensor:
        """``[1, N(+pad), ...]`` -> ``[n, ...]``: each row's sum over its own tokens."""
        flat = t[0, : self.tokens]
        out = flat.new_zeros((self.n, *flat.shape[1:]))
        return out.index_add_(0, self.row.to(flat.device), flat)

    def unpack(self, t: torch.Tensor, fill: Any = 0) -> torch.Tensor:
        """``[1, N(+pad), ...]`` -> ``[n, T_max, ...]``, ``fill`` where a row has no token."""
        flat = t[0, : self.tokens]
        out = flat.new_full((self.n * self.T, *flat.shape[1:]), fill)
        out.index_copy_(0, self.index.to(flat.device), flat)
        return out.reshape(self.n, self.T, *flat.shape[1:])
