"""The summary statistics the geometry benchmarks print (``benchmarks/`` is outside the default
doctest collection, so its doctests run here too).

Exact tier: hand-made step lists whose ratios are known.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    if str(ROOT / "benchmarks") not in sys.path:  # as when a benchmark runs as a script
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TRL = _load("bench_trl_geometry")
VERL = _load("bench_verl_geometry")
RATIOS = importlib.import_module("ratios")  # the module the benchmarks import


@pytest.mark.parametrize("mod", [TRL, VERL, RATIOS],
                         ids=["bench_trl_geometry", "bench_verl_geometry", "ratios"])
def test_benchmark_doctests_pass(mod: ModuleType) -> None:
    res = doctest.testmod(mod)
    assert res.attempted > 0 and res.failed == 0


def _rounds(pairs: list[tuple[float, float]]) -> list[dict]:
    """One warm-up step, then rounds of (off, second_pass, in_run) with the given off / in_run
    seconds (second pass at twice off)."""
    steps = [{"condition": "off", "seconds": 100.0}]
    for off, inrun in pairs:
        steps += [{"condition": "off", "seconds": off},
                  {"condition": "second_pass", "seconds": 2 * off},
                  {"condition": "in_run", "seconds": inrun}]
    return steps


def test_paired_ratio_cancels_a_drift_the_ratio_of_medians_does_not() -> None:
    # the machine slows down 2x over the run; in-run is always 5% above its round's off step
    offs = [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    steps = _rounds([(o, 1.05 * o) for o in offs])
    med, lo, hi = TRL.paired_ratio(steps, "in_run")
    assert med == pytest.approx(1.05) and lo == pytest.approx(1.05) and hi == pytest.approx(1.05)
    lo_m, hi_m = TRL.ratio_interval(steps, "in_run")
    assert hi_m - lo_m > 0.5  # the unpaired interval is spread by the drift


def test_warmup_steps_are_left_out_of_every_summary() -> None:
    steps = _rounds([(1.0, 1.1), (1.0, 1.1)])
    slow_first_round = [{"condition": "off", "seconds": 100.0}] + _rounds([(50.0, 1.0)])[1:]
    both = slow_first_round + steps[1:]
    assert TRL.paired_ratio(both, "in_run", warmup=4)[0] == pytest.approx(1.1)
    rows = {r["condition"]: r for r in TRL.summarize(
        [{**s, "peak_rss_mb": 1.0} for s in both], warmup=4)}
    assert rows["in_run"]["time_ratio"] == pytest.approx(1.1)


def test_schedule_refuses_no_warmup_step() -> None:
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        TRL.schedule(2, warmup=0)


def test_amortised_mean_weighs_the_measured_step_one_in_every() -> None:
    # 8 timed steps, the first measured (10 s), the rest plain (1 s): a plain mean says 2.125 s
    ts = [10.0] + [1.0] * 7
    assert VERL.amortised_mean(ts, every=10) == pytest.approx((10.0 + 9 * 1.0) / 10)
    # 20 steps, measured at 0 and 10: the plain mean and the amortised one agree
    ts20 = [10.0 if i % 10 == 0 else 1.0 for i in range(20)]
    assert VERL.amortised_mean(ts20, every=10) == pytest.approx(sum(ts20) / 20)


def test_module_settings_set_constants_for_a_block_and_restore_them_after_an_error() -> None:
    mod = ModuleType("limits")
    mod.LIMIT, mod.OTHER = 512, "kept"
    settings = VERL.ModuleSettings({(mod, "LIMIT"): 2048})
    with pytest.raises(RuntimeError), settings:
        assert mod.LIMIT == 2048
        raise RuntimeError("a failed step")
    assert (mod.LIMIT, mod.OTHER) == (512, "kept")
    with settings:  # reusable: each block sets and restores
        assert mod.LIMIT == 2048
    assert mod.LIMIT == 512


def test_op_sites_name_the_library_function_that_dispatched_each_operator() -> None:
    import torch

    from real_model.gram import kernels

    K = torch.zeros(2, 2, dtype=torch.float64)
    flat = torch.ones(2, 3, dtype=torch.float64)
    with VERL.OpSites() as ops:
        kernels.flat_gram(K, flat)  # float64 rows: one addmm_ and the transpose
        torch.ones(3) + 1  # the caller's own: two operators
    assert K.tolist() == [[3.0, 3.0], [3.0, 3.0]]
    assert ops.sites == {"kernels.py:flat_gram": 2, VERL.OpSites.HOST: 2}
