"""The capacity formula on known numbers."""
import math

import pytest
from omegaconf import OmegaConf

from experiments.analyse.capacity import check_config, plan
from experiments.core.errors import ConfigError
from experiments.core.reports import BenchmarkReport, LevelReport
from experiments.core.request import Prompt, RequestRecord
from experiments.core.slo import parse_all

CFG = OmegaConf.create({"peak_qps": 200, "sla_tier": "interactive", "headroom": 1.25,
                        "price_per_replica_hour": 2.0,
                        "tiers": {"interactive": ["p99_e2e_ms<=500"], "assistive": ["p95_e2e_ms<=2000"],
                                  "offline": []},
                        "autoscaling": {"scale_up_fraction": 0.8, "scale_up_for_s": 30,
                                        "scale_down_fraction": 0.3, "scale_down_for_s": 180}})


def level(c, e2e_ms, out_tokens=50, duration_s=10.0):
    recs = []
    for i in range(120):
        r = RequestRecord(Prompt(i, (1,), out_tokens), arrival=0.0, engine_start=0.0)
        r.token_times = list(e2e_ms / 1e3 * (1 + k) / out_tokens for k in range(out_tokens))
        recs.append(r)
    return LevelReport(c, duration_s, tuple(recs), {}, 0.0, 0.0, True)


def test_the_seeds_example_needs_the_replicas_the_formula_says():
    # 32 in flight per replica at 400 ms each meets P99 <= 500 ms; 64 in flight (900 ms) does not.
    bench = BenchmarkReport((level(32, 400.0), level(64, 900.0)), tuple(parse_all(["p99_e2e_ms<=500"])))
    p = plan(bench, CFG)
    assert p.concurrency_at_sla == 32 and p.mean_request_s == pytest.approx(0.4)
    assert p.replicas == math.ceil(math.ceil(200 * 0.4 / 32) * 1.25) == 4
    assert p.cost_per_hour == 8.0
    assert p.cost_per_million_output_tokens == pytest.approx(8.0 / (200 * 50 * 3600) * 1e6)
    assert (p.scale_up_queue_depth, p.scale_down_queue_depth) == (26, 9)
    assert "lower bound" not in p.note


def test_a_plan_at_the_top_level_says_it_is_a_lower_bound_and_no_level_means_no_plan():
    assert "lower bound" in plan(BenchmarkReport((level(8, 100.0),)), CFG).note
    with pytest.raises(ValueError, match="no measured level meets"):
        plan(BenchmarkReport((level(8, 900.0),)), CFG)


def test_offline_tier_plans_on_the_highest_throughput():
    # the 120 requests of c=64 took twice as long as c=8's: the lower concurrency served more a second
    bench = BenchmarkReport((level(8, 100.0, duration_s=10), level(64, 2000.0, duration_s=20)))
    p = plan(bench, OmegaConf.merge(CFG, {"sla_tier": "offline"}))
    assert p.concurrency_at_sla == 8 and p.slos == ()
    bench = BenchmarkReport((level(8, 100.0, duration_s=20), level(64, 2000.0, duration_s=10)))
    assert plan(bench, OmegaConf.merge(CFG, {"sla_tier": "offline"})).concurrency_at_sla == 64


@pytest.mark.parametrize("override,message", [({"sla_tier": "gold"}, "sla_tier 'gold' is unknown"),
                                               ({"peak_qps": 0}, "capacity.peak_qps=0 is not a number > 0"),
                                               ({"headroom": 0.5}, r"capacity.headroom=0.5 is not a number in \[1, 3\]")])
def test_bad_capacity_inputs_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        check_config(OmegaConf.merge(CFG, override))
