"""make bench-served: the same candidate in process and behind `roi-ladder serve`, its ratio with an interval."""
import math

import pytest

from conftest import SHARED_CACHE
from experiments.benchmarks.served_vs_in_process import against_margin, main, ratio


def test_the_ratio_is_a_geometric_mean_with_a_t_interval_over_rounds():
    mid, lo, hi = ratio([90.0, 110.0, 100.0], [100.0, 100.0, 100.0])
    assert mid == pytest.approx(math.exp((math.log(0.9) + math.log(1.1)) / 3)) and lo < mid < hi
    assert ratio([50.0, 50.0], [100.0, 100.0]) == pytest.approx((0.5, 0.5, 0.5))
    assert math.isnan(ratio([50.0], [100.0])[1])


def test_a_ratio_is_beyond_within_or_undecided_against_the_gates_margin():
    assert against_margin(0.80, 0.90, 0.05) == "beyond the margin" == against_margin(1.06, 1.2, 0.05)
    assert against_margin(0.96, 1.04, 0.05) == "within the margin"
    assert against_margin(0.897, 0.991, 0.05) == "undecided"


@pytest.mark.slow
def test_one_round_measures_both_sides_and_stops_the_server(capsys, tmp_path):
    import psutil

    main(["--rungs", "baseline", "--rounds", "1", "profile=plumbing", f"data_dir={tmp_path}",
          f"cache_dir={SHARED_CACHE}"])
    out = " ".join(capsys.readouterr().out.split())      # as one line, whatever the console's width
    assert "round 1 of 1: in process" in out and "round 1 of 1: served" in out
    assert "behind roi-ladder serve / in process (1 rounds)" in out and "tokens/s at c=1: " in out
    # the server it started has ended (the fork server that measures in process stays, as in any sweep)
    assert not [p for p in psutil.process_iter(["cmdline"]) if "serve" in (p.info["cmdline"] or [])
                and "experiments.cli" in (p.info["cmdline"] or [])]
