"""Generation agreement judges each disagreement by the baseline's own margin there: a flipped near-tie passes
(where exact matching rejects it), a flip at a confident step fails, in the forward or only in the decode path."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from experiments.judge.agreement import BaselineGenerations, judge, lower_bound

V = 16
NEAR_TIE = 1.0


class Bigram(torch.nn.Module):
    """Next-token logits from the current token alone: a causal LM whose margins are set by hand."""
    device = torch.device("cpu")

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table

    def forward(self, input_ids, use_cache=False, **_):
        return SimpleNamespace(logits=self.table[input_ids])


class BigramEngine:
    """Greedy decode over the table; `decode_table` (a decode-path bug) replaces it after the first step."""
    def __init__(self, table, decode_table=None):
        self.model = Bigram(table)
        self.decode_table = decode_table if decode_table is not None else table

    def generate(self, prompt_ids, max_new_tokens):
        token = prompt_ids[-1]
        for i in range(max_new_tokens):
            token = int((self.model.table if i == 0 else self.decode_table)[token].argmax())
            yield token, 0.0


def cycle_table(near_tie_at=7, gap=0.05):
    """x -> 5x + 3 (mod 16), one cycle through every token, each step 6 nats ahead of the rest, except at
    `near_tie_at`, where the runner-up is only `gap` behind."""
    table = torch.zeros(V, V)
    for x in range(V):
        table[x, (5 * x + 3) % V] = 6.0
    table[near_tie_at, 0] = 6.0 - gap
    return table


def prompts(n=20):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, V, (4,), generator=g).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def reference():
    return BaselineGenerations.record(BigramEngine(cycle_table()), prompts(), tokens=16)


def test_a_flipped_near_tie_fails_exact_agreement_and_passes_the_margin_check(reference):
    flipped = cycle_table()
    flipped[7, 0], flipped[7, (5 * 7 + 3) % V] = 6.0, 6.0 - 0.05    # rounding swaps the near-tie
    report = reference.compare(BigramEngine(flipped + 0.01 * torch.randn(V, V)), NEAR_TIE)
    # every answer passes through token 7 within 16 steps: today's exact rule sees no prompt agree
    assert report.exact == 0 and lower_bound(report.exact, report.n_prompts, 0.95) < 0.5
    assert report.agreed == report.n_prompts and judge(report, 0.5).passed
    assert all(p.divergence_margin < 0.1 for p in report.prompts)


def test_the_baseline_itself_agrees_exactly(reference):
    report = reference.compare(BigramEngine(cycle_table()), NEAR_TIE)
    assert (report.exact, report.agreed, report.forced_top1, report.first_divergence) == (20, 20, 1.0, -1.0)
    assert judge(report, 0.5).passed


def test_a_shuffled_vocabulary_slice_fails(reference):
    broken = cycle_table()
    broken[:, 4:8] = broken[:, [5, 6, 7, 4]]          # four ids' logits permuted: confident steps flip
    report = reference.compare(BigramEngine(broken), NEAR_TIE)
    assert report.agreed <= 2 and not judge(report, 0.5).passed
    assert report.forced_top1 < 0.9


def test_a_decode_path_bug_is_caught_by_the_free_run_alone(reference):
    """Scoring (one forward) is right; the decode steps are not: teacher-forced agreement is perfect, the free
    run diverges at a confident step."""
    report = reference.compare(BigramEngine(cycle_table(), decode_table=cycle_table().roll(1, dims=1)), NEAR_TIE)
    assert report.forced_top1 == 1.0
    assert report.agreed == 0 and not judge(report, 0.5).passed
    assert all(p.first_divergence == 1 and p.divergence_margin > 5.9 for p in report.prompts)


def test_metrics_are_mlflow_names(reference):
    import re

    metrics = reference.compare(BigramEngine(cycle_table()), NEAR_TIE).to_metrics()
    assert all(re.fullmatch(r"[\w./ -]+", k) for k in metrics) and metrics["agreement/share"] == 1.0
