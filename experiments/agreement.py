"""Generation agreement: the share of workload prompts whose greedy output equals the baseline's.

Cheap, needs no task and works for any causal LM: each engine decodes the same prompts greedily for a fixed
number of tokens, and a prompt agrees when the candidate's tokens equal the baseline's answer: its tokens up
to its first stop token (end-of-sequence). Compared past that, engines would differ by design: the benchmark
ignores end-of-sequence, and ONNX Runtime does so by banning the stop token (min_length) where torch emits
it and goes on. A broken engine (wrong cache, wrong tokenizer, garbage weights) agrees on almost none; an
exact engine swap on all of them, except where rounding flips a near-tie. It does not prove the answers are
*good* — only that they are the baseline's; a quantized model may diverge on a prompt and still be right.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

from experiments.gate import Criterion


def greedy(engine, prompt_ids: Sequence[int], tokens: int) -> tuple[int, ...]:
    return tuple(token for token, _ in engine.generate(list(prompt_ids), tokens))


def answer(tokens: Sequence[int], stop_ids: Sequence[int]) -> tuple[int, ...]:
    """The tokens before the first stop token: what a server would have returned."""
    stops = set(stop_ids)
    return tuple(next((tokens[:i] for i, t in enumerate(tokens) if t in stops), tokens))


@dataclass(frozen=True)
class AgreementReport:
    n_prompts: int
    agreed: int
    tokens: int               # greedy tokens decoded per prompt (compared up to the baseline's stop token)
    first_divergence: float   # mean index of the first differing token over the prompts that diverged (-1: none)

    @property
    def share(self) -> float:
        return self.agreed / self.n_prompts

    def to_metrics(self) -> dict[str, float]:
        return {"agreement/n_prompts": float(self.n_prompts), "agreement/tokens": float(self.tokens),
                "agreement/share": self.share, "agreement/first_divergence": self.first_divergence}


@dataclass(frozen=True)
class BaselineGenerations:
    """The baseline's greedy outputs for fixed prompts, recorded once."""
    prompts: tuple[tuple[int, ...], ...]
    tokens: int
    outputs: tuple[tuple[int, ...], ...]

    @classmethod
    def record(cls, engine, prompts: Sequence[Sequence[int]], tokens: int,
               stop_ids: Sequence[int] = ()) -> "BaselineGenerations":
        prompts = tuple(tuple(p) for p in prompts)
        return cls(prompts, tokens, tuple(answer(greedy(engine, p, tokens), stop_ids) for p in prompts))

    def compare(self, engine, progress=None) -> AgreementReport:
        """progress(done, total, what, unit): prompts answered (console.Stage.progress)."""
        divergences = []
        for i, (prompt, base) in enumerate(zip(self.prompts, self.outputs)):
            if progress:
                progress(i, len(self.prompts), "generation agreement", "prompts")
            out = greedy(engine, prompt, self.tokens)[:len(base)]
            first = next((i for i, (a, b) in enumerate(zip(base, out)) if a != b), None)
            if first is None and len(out) != len(base):
                first = len(out)
            if first is not None:
                divergences.append(first)
        return AgreementReport(len(self.prompts), len(self.prompts) - len(divergences), self.tokens,
                               sum(divergences) / len(divergences) if divergences else -1.0)


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
    detail = (f"generation agreement with the baseline: {report.agreed}/{report.n_prompts} prompts' greedy "
              f"answers (up to {report.tokens} tokens) identical (share {report.share:.3f}, lower bound {low:.3f}) "
              f"{'>=' if ok else '<'} {min_share:g}")
    return Criterion("generation_agreement", ok, detail,
                     {"share": report.share, "share_lower": low, "min_share": min_share,
                      "n_prompts": float(report.n_prompts)})
