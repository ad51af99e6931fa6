"""Generation agreement: does the candidate decode the baseline's greedy answers, up to near-ties?

Exact agreement over n tokens with per-token top-1 agreement p is about p^n, so an exact-match share rejects
harmless numerics changes by construction (0.944^16 = 0.40). What separates a broken engine from a harmless one
is *where* it disagrees: rounding flips only near-ties, where the baseline itself barely preferred its token;
a broken engine (wrong positions, cache, mask, weights, vocabulary) disagrees where the baseline was confident.

So each disagreement is judged by the baseline's own margin, log p(its token) - log p(candidate's token), at
that step (recorded once from the baseline's scores of prompt + its answer):
- free-running: the candidate decodes greedily in its own decode path (KV cache included); at its first
  differing token the two contexts were still identical, so the baseline's margin there says whether it was
  a near-tie (< near_tie nats) or a confident step;
- teacher-forced: the candidate scores prompt + the baseline's answer in one forward and every step whose
  argmax differs is judged the same way. This sees past the first divergence, but not the decode path: the
  free run covers that (a truncated KV cache, positions lost between decode steps).
A prompt agrees when neither shows a confident disagreement; the gate is on the share of such prompts. The
exact share and mean first divergence are still reported, as information. Like exact agreement it does not
prove answers are *good*, only that the candidate decodes as the baseline would have, up to near-ties.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from experiments.judge.fidelity import logprob_scorer, predicting
from experiments.judge.gate import Criterion

TOP_K = 32   # baseline log-probs kept per step; a token outside them is at least the K-th's margin away


def greedy(engine, prompt_ids: Sequence[int], tokens: int) -> tuple[int, ...]:
    return tuple(token for token, _ in engine.generate(list(prompt_ids), tokens))


def answer(tokens: Sequence[int], stop_ids: Sequence[int]) -> tuple[int, ...]:
    """The tokens before the first stop token: what a server would have returned."""
    stops = set(stop_ids)
    return tuple(next((tokens[:i] for i, t in enumerate(tokens) if t in stops), tokens))


def _scorer(engine):
    return logprob_scorer(engine)


@dataclass(frozen=True)
class StepScores:
    """The baseline's top-K next-token log-probs at each step of one answer (normalized rows)."""
    ids: np.ndarray = field(repr=False)        # [steps, K]
    logprobs: np.ndarray = field(repr=False)   # [steps, K], descending

    @classmethod
    def of(cls, rows: np.ndarray) -> "StepScores":
        rows = np.asarray(rows, dtype=np.float64)
        rows = rows - logsumexp(rows, axis=-1, keepdims=True)
        k = min(TOP_K, rows.shape[-1])
        ids = np.argsort(-rows, axis=-1, kind="stable")[:, :k]
        return cls(ids, np.take_along_axis(rows, ids, axis=-1).astype(np.float32))

    def margin(self, step: int, chosen: int, other: int) -> float:
        """log p(chosen) - log p(other) in the baseline at `step`; a token outside the top K counts as the K-th
        (a lower bound of its margin)."""
        ids, lps = self.ids[step], self.logprobs[step]
        floor = float(lps[-1])
        lp = {int(i): float(v) for i, v in zip(ids, lps)}
        return lp.get(chosen, floor) - lp.get(other, floor)


@dataclass(frozen=True)
class PromptAgreement:
    exact: bool
    first_divergence: int | None     # free run: index of the first differing token
    divergence_margin: float         # the baseline's margin there (nats; nan: no divergence)
    forced_steps: int                # teacher-forced steps compared
    forced_agreed: int               # ... where the candidate's argmax is the baseline's token
    forced_worst_margin: float       # largest baseline margin at a teacher-forced disagreement (0: none)

    def confident(self, near_tie: float) -> bool:
        free = self.first_divergence is not None and not self.divergence_margin < near_tie
        return free or self.forced_worst_margin >= near_tie


@dataclass(frozen=True)
class AgreementReport:
    prompts: tuple[PromptAgreement, ...]
    tokens: int               # greedy tokens decoded per prompt (compared up to the baseline's stop token)
    near_tie: float           # nats: a disagreement where the baseline's margin was below this is a near-tie

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)

    @property
    def agreed(self) -> int:
        """Prompts without a confident disagreement, free-running or teacher-forced: what the gate counts."""
        return sum(not p.confident(self.near_tie) for p in self.prompts)

    @property
    def exact(self) -> int:
        return sum(p.exact for p in self.prompts)

    @property
    def share(self) -> float:
        return self.agreed / self.n_prompts

    @property
    def first_divergence(self) -> float:
        """Mean index of the first differing token over the prompts that diverged (-1: none)."""
        firsts = [p.first_divergence for p in self.prompts if p.first_divergence is not None]
        return float(np.mean(firsts)) if firsts else -1.0

    @property
    def forced_top1(self) -> float:
        steps = sum(p.forced_steps for p in self.prompts)
        return sum(p.forced_agreed for p in self.prompts) / steps if steps else 1.0

    def to_metrics(self) -> dict[str, float]:
        free = sum(p.first_divergence is not None and not p.divergence_margin < self.near_tie for p in self.prompts)
        forced = sum(p.forced_worst_margin >= self.near_tie for p in self.prompts)
        return {"agreement/n_prompts": float(self.n_prompts), "agreement/tokens": float(self.tokens),
                "agreement/share": self.share, "agreement/exact_share": self.exact / self.n_prompts,
                "agreement/first_divergence": self.first_divergence, "agreement/near_tie_nats": self.near_tie,
                "agreement/confident_free_running": float(free), "agreement/confident_teacher_forced": float(forced),
                "agreement/teacher_forced_top1": self.forced_top1}


@dataclass(frozen=True)
class BaselineGenerations:
    """The baseline's greedy answers for fixed prompts and its scores along them, recorded once."""
    prompts: tuple[tuple[int, ...], ...]
    tokens: int
    outputs: tuple[tuple[int, ...], ...]
    scores: tuple[StepScores, ...] = field(repr=False)

    @classmethod
    def record(cls, engine, prompts: Sequence[Sequence[int]], tokens: int,
               stop_ids: Sequence[int] = ()) -> "BaselineGenerations":
        prompts = tuple(tuple(p) for p in prompts)
        outputs = tuple(answer(greedy(engine, p, tokens), stop_ids) for p in prompts)
        score = _scorer(engine)
        return cls(prompts, tokens, outputs, tuple(StepScores.of(_answer_rows(score, p, o))
                                                   for p, o in zip(prompts, outputs)))

    def compare(self, engine, near_tie: float, progress=None) -> AgreementReport:
        """progress(done, total, what, unit): prompts answered (console.Stage.progress)."""
        score, out = _scorer(engine), []
        for i, (prompt, base, ref) in enumerate(zip(self.prompts, self.outputs, self.scores)):
            if progress:
                progress(i, len(self.prompts), "generation agreement", "prompts")
            free = greedy(engine, prompt, self.tokens)[:len(base)]
            first = next((j for j, (a, b) in enumerate(zip(base, free)) if a != b), None)
            if first is None and len(free) != len(base):   # stopped early: no token to weigh, never a near-tie
                first, margin = len(free), np.inf
            else:
                margin = ref.margin(first, base[first], free[first]) if first is not None else np.nan
            forced = _answer_rows(score, prompt, base).argmax(-1) if base else np.zeros(0, int)
            worst = max((ref.margin(j, b, int(c)) for j, (b, c) in enumerate(zip(base, forced)) if b != c),
                        default=0.0)
            out.append(PromptAgreement(first is None, first, float(margin), len(base),
                                       int(sum(b == c for b, c in zip(base, forced))), float(worst)))
        return AgreementReport(tuple(out), self.tokens, near_tie)


def _answer_rows(score, prompt: Sequence[int], output: Sequence[int]) -> np.ndarray:
    """Log-prob rows predicting each answer token, from one forward over prompt + answer."""
    if not output:
        return np.zeros((0, 1))
    return predicting(score, list(prompt) + list(output))[len(prompt) - 1:]


def lower_bound(agreed: int, n: int, confidence: float) -> float:
    """One-sided Wilson score lower bound of a share."""
    z = float(stats.norm.ppf(confidence))
    p = agreed / n
    centre = p + z * z / (2 * n)
    spread = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5)
    return max(0.0, (centre - spread) / (1 + z * z / n))


def judge(report: AgreementReport, min_share: float, confidence: float = 0.95) -> Criterion:
    low = lower_bound(report.agreed, report.n_prompts, confidence)
    ok = low >= min_share
    detail = (f"generation agreement with the baseline: {report.agreed}/{report.n_prompts} prompts' greedy answers "
              f"(up to {report.tokens} tokens) decoded without a confident disagreement (a flip where the "
              f"baseline's margin was >= {report.near_tie:g} nats; share {report.share:.3f}, lower bound {low:.3f}) "
              f"{'>=' if ok else '<'} {min_share:g}; {report.exact}/{report.n_prompts} identical, teacher-forced "
              f"top-1 {report.forced_top1:.3f}")
    return Criterion("generation_agreement", ok, detail,
                     {"share": report.share, "share_lower": low, "min_share": min_share,
                      "n_prompts": float(report.n_prompts), "exact_share": report.exact / report.n_prompts,
                      "near_tie": report.near_tie, "teacher_forced_top1": report.forced_top1})
