import numpy as np
import pytest
from scipy import stats

from experiments.core.stats import LatencyStats, ratio_ci


def test_percentiles_and_n_on_known_samples():
    st = LatencyStats.from_samples(np.arange(1, 201, dtype=float))
    assert st.n == 200
    assert st.p50.value == pytest.approx(100.5)
    assert st.p99 is not None and st.p99.value == pytest.approx(198.01)
    assert st.p50.ci_low < st.p50.value < st.p50.ci_high


def test_no_p99_claim_under_100_samples():
    assert LatencyStats.from_samples(np.ones(99)).p99 is None
    assert LatencyStats.from_samples([]) is None


@pytest.mark.parametrize("q_name,q", [("p50", 0.5), ("p95", 0.95)])
def test_quantile_ci_covers_true_value_at_stated_rate(q_name, q):
    rng = np.random.default_rng(0)
    true = float(np.exp(stats.norm.ppf(q)))   # the q-quantile of lognormal(0, 1)
    hits = 0
    trials = 400
    for _ in range(trials):
        st = LatencyStats.from_samples(rng.lognormal(size=300), confidence=0.95)
        qt = getattr(st, q_name)
        hits += qt.ci_low <= true <= qt.ci_high
    assert hits / trials >= 0.92     # nominal 0.95; order-statistic intervals are conservative


def test_ratio_ci_detects_a_real_difference_and_brackets_no_difference():
    rng = np.random.default_rng(1)
    fast, slow = rng.normal(50, 5, 200), rng.normal(100, 10, 200)
    ratio, lo, hi = ratio_ci(fast, slow, "p50", 0.95, 1000, seed=0)
    assert ratio == pytest.approx(0.5, abs=0.05) and hi < 0.6
    same_a, same_b = rng.normal(100, 10, 200), rng.normal(100, 10, 200)
    _, lo, hi = ratio_ci(same_a, same_b, "p50", 0.95, 1000, seed=0)
    assert lo < 1.0 < hi
