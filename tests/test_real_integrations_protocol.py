"""``integrations.protocol.gradient_row_metrics``: metrics of a host's actual gradient rows from
their Gram (used by the verl integration's in-run geometry)."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_theory.spectral import spectral_metrics_from_matrix
from real_model.integrations.protocol import (
    gradient_row_metrics,
    gradient_row_metrics_batch,
    group_records,
)

KEYS = ("effective_rank", "entropy_effective_rank", "stable_rank", "top1_fraction")


def test_collinear_rows_by_hand():
    m = gradient_row_metrics([[4.0, 2.0], [2.0, 1.0]])  # g_1 = 2 e, g_2 = e
    assert m["rank"] == 1 and m["effective_rank"] == 1.0 and m["top1_fraction"] == 1.0
    assert m["grad_norm"] == 3.0  # ||g_1 + g_2||


def test_all_zero_rows_give_none_not_nan():
    m = gradient_row_metrics(np.zeros((3, 3)))
    assert m["rank"] == 0 and m["grad_norm"] == 0.0
    assert all(m[k] is None for k in KEYS)


def test_equals_the_svd_of_the_rows():
    rng = np.random.default_rng(0)
    G = rng.standard_normal((5, 40)) * rng.uniform(0.1, 3.0, (5, 1))
    m = gradient_row_metrics(G @ G.T)
    ref = spectral_metrics_from_matrix(G).as_dict()
    for k in ("rank", *KEYS):
        assert np.isclose(m[k], ref[k], rtol=1e-9), k
    assert np.isclose(m["grad_norm"], np.linalg.norm(G.sum(0)), rtol=1e-12)


def test_group_records_row_gram_route_is_gradient_row_metrics():
    rng = np.random.default_rng(1)
    G, P = rng.standard_normal((4, 30)), rng.standard_normal((4, 30))
    rec = group_records(P @ P.T, [1, 0, 1, 0], [1.0, -1.0, 1.0, -1.0], None, [3, 4, 5, 6],
                        row_gram=G @ G.T)
    for key, val in gradient_row_metrics(G @ G.T).items():
        assert rec[key] == val, key


def test_batch_over_grams_of_sizes_2_4_2_equals_the_per_gram_function_in_order():
    rng = np.random.default_rng(2)
    Ks = []
    for R in (2, 4, 2):
        G = rng.standard_normal((R, 6))
        Ks.append(G @ G.T)
    batch = gradient_row_metrics_batch(Ks)
    assert batch == [gradient_row_metrics(K) for K in Ks]
    assert [len(m["singular_values"]) for m in batch] == [2, 4, 2]
    assert gradient_row_metrics_batch([]) == []


def test_batch_error_names_the_failing_gram():
    bad = np.eye(2)
    bad[0, 1] = 0.5
    with pytest.raises(ValueError, match=r"Ks\[2\]: K must be symmetric"):
        gradient_row_metrics_batch([np.eye(2), np.eye(4), bad])
