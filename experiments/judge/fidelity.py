"""Fidelity against the baseline: how far a candidate's next-token distributions drift from the baseline's.

Model-agnostic and cheap (one forward per fixed window of held-out text, no task, no generation), and far more
sensitive to quantization damage than a task accuracy: KL(baseline || candidate) per position, top-1
agreement, and the perplexity ratio, each engine scored in its own runtime.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from experiments.judge.gate import Criterion

Scorer = Callable[[Sequence[int]], np.ndarray]


@dataclass(frozen=True)
class TopLogprobs:
    """Next-token log-probs of a sequence as a server returns them (its prompt log-probs): each position's top K
    tokens, and the token that followed it in the sequence, which the server always scores. Row t is the
    distribution after tokens[:t + 1]; the last row's next token is unknown (-1, nan)."""
    ids: np.ndarray = field(repr=False)        # [len, K], most likely first
    logprobs: np.ndarray = field(repr=False)   # [len, K]
    followed: np.ndarray = field(repr=False)   # [len]: log p(tokens[t + 1]) at row t
    followed_ids: np.ndarray = field(repr=False)
    source: str = "the server's top-{k} prompt log-probs"

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, rows: slice) -> "TopLogprobs":
        return TopLogprobs(self.ids[rows], self.logprobs[rows], self.followed[rows], self.followed_ids[rows],
                           self.source)

    def argmax(self, axis: int = -1) -> np.ndarray:
        return self.ids[:, 0]

    def describe(self) -> str:
        return (f"{self.source.format(k=self.ids.shape[-1])}: KL over those tokens and the rest of the vocabulary as "
                f"one (a lower bound of the full KL); top-1 and perplexity exact")


def predicting(score: Scorer, tokens: Sequence[int]):
    """The scorer's rows predicting tokens[1:]. A server scores the token that followed only inside the sequence
    it is given, so a top-K scorer gets all of it (and its last row is dropped); a full-vocabulary one tokens[:-1]."""
    if getattr(score, "top_k", None):
        return score(list(tokens))[:-1]
    return score(list(tokens)[:-1])


# --- log-probabilities, each engine in its own runtime ----------------------------------------------------
def logprob_scorer(engine) -> Scorer:
    """token ids -> [len, vocab] next-token log-probs, from whatever the engine offers.

    A torch module at `.model` is run directly; otherwise the engine's lm-eval model must score with
    `_logprobs` (ONNX Runtime on the exported graph; a serving engine's server, whose `_logprobs` has `top_k` and
    returns TopLogprobs). Build once per engine: the ONNX session is not free.
    """
    import torch  # heavy

    model = getattr(engine, "model", None)
    if isinstance(model, torch.nn.Module):
        # through the callable that serves (a compiled one: its own kernels), else the module itself
        return partial(_torch_logprobs, getattr(engine, "serving_forward", model), model.device)
    lm = engine.lm_eval_model(batch_size=1)
    if callable(getattr(lm, "_logprobs", None)):
        return lm._logprobs
    raise TypeError(f"{type(engine).__name__} offers neither a torch `.model` nor an lm-eval model with "
                    f"`_logprobs`: it cannot be scored for fidelity")


def sequence_logprobs(engine, token_ids: Sequence[int]) -> np.ndarray:
    """[len(token_ids), vocab] next-token log-probs of one sequence, in the engine's own runtime."""
    return logprob_scorer(engine)(token_ids)


def _torch_logprobs(forward, device, token_ids: Sequence[int]) -> np.ndarray:
    import torch  # heavy

    with torch.inference_mode():
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
        logits = forward(input_ids=ids, use_cache=False).logits[0].cpu()
    # float64 before the softmax, as the ONNX scorer does, so both runtimes round the same way afterwards.
    return torch.log_softmax(logits.double(), dim=-1).numpy()


# --- the math --------------------------------------------------------------------------------------------
def kl_per_position(baseline_logprobs: np.ndarray, candidate_logprobs) -> np.ndarray:
    """KL(P || Q) per row from log-probs; rows are renormalized first, so float32 rounding is not divergence."""
    if isinstance(candidate_logprobs, TopLogprobs):
        return _kl_top_k(baseline_logprobs, candidate_logprobs)
    lp = _normalized(baseline_logprobs)
    lq = _normalized(candidate_logprobs)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):   # 0 * -inf where P has no mass: that term is 0 by definition
        terms = np.where(p > 0, p * (lp - lq), 0.0)
    return np.maximum(terms.sum(axis=-1), 0.0)


def _kl_top_k(baseline_logprobs: np.ndarray, top: TopLogprobs) -> np.ndarray:
    """KL(P || Q) over the partition {each of Q's known tokens} + {the rest}: by the data-processing inequality
    a lower bound of the full KL, equal to it when the rest holds little mass. The known tokens are the top K
    and the token that followed (when it is outside them)."""
    p = np.exp(_normalized(baseline_logprobs))
    extra = top.followed_ids[:, None]
    outside = (extra >= 0) & ~(top.ids == extra).any(-1, keepdims=True)
    ids = np.concatenate([top.ids, np.where(outside, extra, top.ids[:, :1])], axis=-1)
    lq = np.concatenate([top.logprobs, top.followed[:, None]], axis=-1).astype(np.float64)
    known = np.concatenate([np.ones_like(top.ids, dtype=bool), outside], axis=-1)
    p_known = np.where(known, np.take_along_axis(p, ids, axis=-1), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p_known > 0, p_known * (np.log(p_known) - lq), 0.0).sum(-1)
        p_rest = np.clip(1.0 - p_known.sum(-1), 0.0, 1.0)
        q_rest = np.clip(1.0 - np.where(known, np.exp(lq), 0.0).sum(-1), 1e-12, 1.0)
        rest = np.where(p_rest > 0, p_rest * np.log(p_rest / q_rest), 0.0)
    return np.maximum(terms + rest, 0.0)


def _normalized(logprobs: np.ndarray) -> np.ndarray:
    lp = np.asarray(logprobs, dtype=np.float64)
    return lp - logsumexp(lp, axis=-1, keepdims=True)


def _next_token_logprobs(logprobs_of_prefix, window: Sequence[int]) -> np.ndarray:
    """log p(window[t+1]) from the log-probs of window[:-1] (one row per prediction)."""
    if isinstance(logprobs_of_prefix, TopLogprobs):
        return logprobs_of_prefix.followed.astype(np.float64)
    return _normalized(logprobs_of_prefix)[np.arange(len(window) - 1), np.asarray(window[1:])]


def mean_and_se(per_sequence: np.ndarray) -> tuple[float, float]:
    """Mean over sequences and its standard error (positions within a window are not independent)."""
    values = np.asarray(per_sequence, dtype=np.float64)
    se = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0
    return float(values.mean()), se


FULL = "full vocabulary"


# --- fixed windows of held-out text ----------------------------------------------------------------------
def fixed_sequences(tokenizer, texts: Sequence[str], n: int, length: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """n distinct, non-overlapping windows of `length` tokens from the texts, chosen by a seeded draw."""
    stream = [t for text in texts for t in tokenizer.encode(text, add_special_tokens=False)]
    slots = len(stream) // length
    if length < 2 or slots < n:
        raise ValueError(f"need {n} windows of {length} (>= 2) tokens; the texts hold {len(stream)} tokens "
                         f"({slots} windows)")
    starts = random.Random(seed).sample(range(slots), n)
    return tuple(tuple(stream[s * length:(s + 1) * length]) for s in starts)


# --- the report ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FidelityReport:
    n_sequences: int
    n_positions: int
    kl_mean: float            # mean KL(baseline || candidate) per position, in nats
    kl_se: float              # standard error over sequences
    top1_agreement: float     # share of positions where both argmaxes agree
    top1_se: float
    baseline_ppl: float       # over the windows' next-token predictions
    candidate_ppl: float
    basis: str = FULL         # what the candidate's log-probs held (TopLogprobs.describe for a server)

    @property
    def ppl_ratio(self) -> float:
        return self.candidate_ppl / self.baseline_ppl

    def to_metrics(self) -> dict[str, float]:
        return {"fidelity/n_sequences": float(self.n_sequences), "fidelity/n_positions": float(self.n_positions),
                "fidelity/kl_mean": self.kl_mean, "fidelity/kl_se": self.kl_se,
                "fidelity/top1_agreement": self.top1_agreement, "fidelity/top1_se": self.top1_se,
                "fidelity/ppl_baseline": self.baseline_ppl, "fidelity/ppl_candidate": self.candidate_ppl,
                "fidelity/ppl_ratio": self.ppl_ratio}


@dataclass(frozen=True)
class BaselineLogprobs:
    """The baseline's log-probs on fixed windows, recorded once so the baseline engine need not stay alive.

    Stored as float32, full vocabulary: windows x (length - 1) x vocab x 4 bytes (32 x 127 x 2048 = 33 MB for
    the built-in model).
    """
    sequences: tuple[tuple[int, ...], ...]
    logprobs: tuple[np.ndarray, ...] = field(repr=False)   # per window: [length - 1, vocab]

    @classmethod
    def record(cls, engine, sequences: Sequence[Sequence[int]]) -> "BaselineLogprobs":
        score = logprob_scorer(engine)
        if getattr(score, "top_k", None):
            raise ValueError(f"the baseline's log-probs must cover the whole vocabulary; {engine.name}'s server "
                             f"returns its top {score.top_k} only (a baseline runs in process)")
        windows = tuple(tuple(s) for s in sequences)
        # The last token has no next token inside the window: score window[:-1], predict window[1:].
        return cls(windows, tuple(predicting(score, w).astype(np.float32) for w in windows))

    def compare(self, candidate_engine, progress=None) -> FidelityReport:
        """progress(done, total, what, unit): windows scored (console.Stage.progress)."""
        score = logprob_scorer(candidate_engine)
        kl, top1, base_nll, cand_nll, basis = [], [], [], [], FULL
        for i, (window, base) in enumerate(zip(self.sequences, self.logprobs)):
            if progress:
                progress(i, len(self.sequences), "fidelity", "windows")
            cand = predicting(score, window)
            if isinstance(cand, TopLogprobs):
                basis = cand.describe()
            kl.append(kl_per_position(base, cand).mean())
            top1.append((base.argmax(-1) == cand.argmax(-1)).mean())
            base_nll.append(-_next_token_logprobs(base, window).mean())
            cand_nll.append(-_next_token_logprobs(cand, window).mean())
        kl_mean, kl_se = mean_and_se(np.array(kl))
        top1_mean, top1_se = mean_and_se(np.array(top1))
        return FidelityReport(
            n_sequences=len(self.sequences), n_positions=sum(len(w) - 1 for w in self.sequences),
            kl_mean=kl_mean, kl_se=kl_se, top1_agreement=top1_mean, top1_se=top1_se,
            baseline_ppl=float(np.exp(np.mean(base_nll))), candidate_ppl=float(np.exp(np.mean(cand_nll))),
            basis=basis)


def fidelity(baseline_engine, candidate_engine, sequences: Sequence[Sequence[int]]) -> FidelityReport:
    return BaselineLogprobs.record(baseline_engine, sequences).compare(candidate_engine)


# --- the gate criterion ----------------------------------------------------------------------------------
def judge(report: FidelityReport, max_kl: float, min_top1: float, confidence: float = 0.95) -> Criterion:
    """Pass when KL's upper and top-1's lower one-sided bound (normal, over sequences) are within the limits."""
    z = float(stats.norm.ppf(confidence))
    kl_upper = report.kl_mean + z * report.kl_se
    top1_lower = report.top1_agreement - z * report.top1_se
    kl_ok, top1_ok = kl_upper <= max_kl, top1_lower >= min_top1
    detail = (f"fidelity vs baseline over {report.n_positions} positions: "
              f"KL {report.kl_mean:.2e} (upper {kl_upper:.2e}) {'<=' if kl_ok else '>'} {max_kl:g}, "
              f"top-1 {report.top1_agreement:.4f} (lower {top1_lower:.4f}) {'>=' if top1_ok else '<'} {min_top1:g}, "
              f"ppl ratio {report.ppl_ratio:.4f}" + ("" if report.basis == FULL else f"; from {report.basis}"))
    return Criterion("fidelity", kl_ok and top1_ok, detail,
                     {"kl_mean": report.kl_mean, "kl_upper": kl_upper, "max_kl": max_kl,
                      "top1_agreement": report.top1_agreement, "top1_lower": top1_lower, "min_top1": min_top1,
                      "ppl_ratio": report.ppl_ratio})
