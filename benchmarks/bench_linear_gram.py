"""Per-Linear cost of the exact Gram methods, against the host's own weight-gradient product.

One ``nn.Linear`` ``d_in -> d_out`` (``--shape``, several allowed: their times are summed, e.g.
one transformer layer's projections), a micro-batch of ``--rows`` rows of ``--tokens`` tokens
in blocks (groups) of ``--block`` rows, random float32 inputs ``a`` and output gradients
``delta``. Timed interleaved (one call of each per round, ``--rounds``), medians:

* ``host``: ``delta^T a``, the product autograd forms for ``dW``;
* ``rows``: ``gram.rows.linear_weight_grad_and_gram``: the per-row products, their sum
  (``dW``) and each block's Gram. The in-run capture with ``weight_grads="rows"`` runs this
  *instead of* the host's product: its extra cost is ``rows - host``;
* ``identity f64`` / ``identity f32``: each block's identity from its token kernels
  (``gram.linear_gram.linear_weight_gram_identity``, float64 or float32 kernels). The host still
  forms ``dW``: its extra cost is the whole time.

``--packed`` lays the rows out as one packed sequence (verl's remove-padding micro-batches):
the rows path multiplies each row on its own tokens (``segments``) and the identity runs on each
block's tokens (``linear_weight_gram_identity_packed``).

Why it matters: the per-row products have the host's multiply-adds but write ``rows x d_in x
d_out`` floats, which the sum and the Gram read again; with few tokens per row that traffic,
not the arithmetic, sets the cost. The printed "extra" columns are the in-run overhead of one
such Linear per micro-batch, as a multiple of the host's product.

    PYTHONPATH=$PWD OMP_NUM_THREADS=2 python benchmarks/bench_linear_gram.py \\
        --shape 576x576 576x192 576x192 576x576 576x1536 576x1536 1536x576 --rows 8 --tokens 117
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from real_model.gram import kernels, linear_gram
from real_model.gram import rows as gram_rows


def _shape(text: str) -> tuple[int, int]:
    try:
        d_in, d_out = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be D_INxD_OUT, e.g. 576x1536, got {text!r}") from None
    if d_in < 1 or d_out < 1:
        raise argparse.ArgumentTypeError(f"shape dimensions must be positive, got {text!r}")
    return d_in, d_out


def methods(a: torch.Tensor, delta: torch.Tensor, *, R: int, T: int, block: int, packed: bool,
            chunk: int) -> dict[str, Callable[[], object]]:
    """The timed calls for one Linear: ``a`` ``[R T, d_in]``, ``delta`` ``[R T, d_out]``."""
    starts = [(b0, min(R, b0 + block)) for b0 in range(0, R, block)]
    scratch = kernels.Scratch()
    segments = [(i * T, (i + 1) * T) for i in range(R)] if packed else None
    a3, g3 = a.view(R, T, -1), delta.view(R, T, -1)

    def host() -> object:
        return delta.T.mm(a)

    def rows() -> object:
        blocks = [(torch.zeros(b1 - b0, b1 - b0, dtype=torch.float64), slice(b0, b1))
                  for b0, b1 in starts]
        dW = gram_rows.linear_weight_grad_and_gram(
            blocks, a if packed else a3, delta if packed else g3, chunk_size=chunk,
            scratch=scratch, product_dtype=torch.float32, segments=segments)
        return dW, [K for K, _ in blocks]

    def identity(dtype: torch.dtype) -> Callable[[], object]:
        def run() -> object:
            out = []
            for b0, b1 in starts:
                if packed:
                    S = torch.repeat_interleave(torch.eye(b1 - b0, dtype=torch.float64), T, dim=1)
                    out.append(linear_gram.linear_weight_gram_identity_packed(
                        a[b0 * T: b1 * T], delta[b0 * T: b1 * T], S, product_dtype=dtype))
                else:
                    out.append(torch.zeros(b1 - b0, b1 - b0, dtype=torch.float64))
                    linear_gram.linear_weight_gram_identity(out[-1], a3[b0:b1], g3[b0:b1],
                                                   chunk_size=chunk, product_dtype=dtype)
            return out
        return run

    return {"host": host, "rows": rows, "identity f64": identity(torch.float64),
            "identity f32": identity(torch.float32)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=_shape, nargs="+", default=[(576, 1536)],
                    help="D_INxD_OUT of each Linear (times summed over them)")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=117, help="tokens per row")
    ap.add_argument("--block", type=int, default=4, help="rows per block (group)")
    ap.add_argument("--packed", action="store_true", help="rows packed into one sequence")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for name in ("rows", "tokens", "block", "rounds"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(a, name)}")
    torch.manual_seed(a.seed)
    R, T = a.rows, a.tokens
    calls = []
    for d_in, d_out in a.shape:
        x, g = torch.randn(R * T, d_in), torch.randn(R * T, d_out)
        calls.append(methods(x, g, R=R, T=T, block=a.block, packed=a.packed,
                             chunk=kernels.CPU_CHUNK_SIZE))
    for c in calls:  # every method computes the same thing (else its time means nothing)
        dW, K_rows = c["rows"]()
        assert torch.allclose(dW, c["host"](), rtol=1e-4, atol=1e-3), "rows: dW != host's"
        for k in ("identity f64", "identity f32"):
            for K, K_ref in zip(c[k](), K_rows, strict=True):
                err = ((K - K_ref).abs().max() / K_ref.abs().max()).item()
                assert err <= 1e-5, f"{k}: Gram off the rows' by {err:.1e}"
    names = list(calls[0])
    times: dict[str, list[float]] = {k: [] for k in names}
    for k in names:  # warm-up
        for c in calls:
            c[k]()
    for _ in range(a.rounds):
        for k in names:
            t0 = time.perf_counter()
            for c in calls:
                c[k]()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    host = med["host"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load average "
          f"{os.getloadavg()[0]:.2f}; Linear(s) {' '.join(f'{i}x{o}' for i, o in a.shape)}; "
          f"{R} rows x {T} tokens, blocks of {a.block}, {'packed' if a.packed else 'batch-first'};"
          f" medians of {a.rounds} interleaved rounds, seed {a.seed}; dW and Grams of every "
          "method checked against each other first")
    print("\n| method | ms | vs host | extra in-run cost, x host product |\n|---|---|---|---|")
    for k in names:
        extra = "-" if k == "host" else f"{(med[k] - host if k == 'rows' else med[k]) / host:.2f}"
        print(f"| {k} | {med[k] * 1e3:.2f} | {med[k] / host:.2f}x | {extra} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
