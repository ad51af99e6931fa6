"""make bench-agreement: the generation-agreement check's error rates on known answers.

Harmless changes (int8 weight-only, bf16, exact engine swaps) must pass, broken engines (experiments/
benchmarks/agreement_variants.py) must fail. Each trial is one gate decision: the target's `agreement.prompts`
workload prompts (disjoint sets, trial by trial), the baseline's answers recorded once per set, judged with the
target's min_share and near_tie. Beside each verdict: the old exact-match rule on the same prompts, and
fidelity's KL on the target's fidelity windows, with the largest baseline margin at which a top-1 flip
happened there (what near_tie must sit above for harmless changes and below for broken ones).

    python -m experiments.benchmarks.agreement_check [target=smollm2] [--trials 4] [--onnxruntime]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM

from experiments.benchmarks.agreement_variants import BROKEN, HARMLESS, OTHER, VariantEngine
from experiments.benchmarks.common import compose_default
from experiments.core.recipe import Candidate
from experiments.judge import agreement
from experiments.judge.fidelity import BaselineLogprobs, fixed_sequences, judge as fidelity_judge, logprob_scorer
from experiments.record.console import quiet_libraries
from experiments.serving import build_engine
from experiments.targets.kinds.causal_lm import CausalLMScorer
from experiments.targets.resolve import resolve
from optimizers.baseline import EagerBaseline
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.quantization import WeightQuantization


def flip_margins(ref: BaselineLogprobs, engine) -> np.ndarray:
    """The baseline's margin (its top-1 over the candidate's) at every window position where the top-1 flipped."""
    score, out = logprob_scorer(engine), []
    for window, base in zip(ref.sequences, ref.logprobs):
        cand = score(window[:-1]).argmax(-1)
        top = base.argmax(-1)
        rows = np.arange(len(top))
        out.extend((base[rows, top] - base[rows, cand])[cand != top])
    return np.asarray(out)


def onnxruntime_engines(cfg, target, threads: int) -> dict:
    ort = OnnxRuntimeSwap().apply(EagerBaseline().apply(Candidate(target)))
    artefacts = Path(cfg.cache_dir) / "artefacts"
    return {"onnxruntime fp32 (exact swap)": lambda _: build_engine(ort, threads, artefacts),
            "onnxruntime int8 (the issue's)": lambda _: build_engine(WeightQuantization("int8").apply(ort), threads,
                                                                     artefacts)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. target=smollm2")
    parser.add_argument("--trials", type=int, default=4, help="gate decisions per variant (disjoint prompt sets)")
    parser.add_argument("--onnxruntime", action="store_true", help="also ONNX Runtime fp32 and int8 (export once)")
    args = parser.parse_args(argv)
    quiet_libraries()
    console = Console(width=160)
    probe = compose_default(args.overrides)
    per_trial = int(probe.target.agreement.prompts)
    # no lm-eval task: only the workload, the fidelity windows and the agreement settings are used
    cfg = compose_default([*args.overrides, f"target.workload.prompts={per_trial * args.trials}",
                           "accuracy.tasks=[]"])
    torch.set_num_threads(int(cfg.threads))
    target, texts, _ = resolve(cfg.target, Path(cfg.cache_dir), Path(cfg.data_dir), console.print)
    scorer = CausalLMScorer(cfg, target, texts, None)
    spec, confidence = cfg.target.agreement, float(cfg.gate.confidence)
    near_tie, min_share, tokens = float(spec.near_tie), float(spec.min_share), int(spec.tokens)
    prompts = [p.token_ids for p in scorer.workload().prompts]
    sets = [prompts[i * per_trial:(i + 1) * per_trial] for i in range(args.trials)]
    model = AutoModelForCausalLM.from_pretrained(target.model_dir, dtype=torch.float32)
    baseline = VariantEngine(model)
    console.print(f"{target.name}: {args.trials} trials x {per_trial} prompts x {tokens} tokens; near_tie "
                  f"{near_tie:g} nats, min_share {min_share:g} at {confidence:.0%}")
    refs = [agreement.BaselineGenerations.record(baseline, s, tokens, scorer.stop_ids) for s in sets]
    windows = fixed_sequences(scorer.tokenizer, texts, int(cfg.gate.fidelity.sequences),
                              int(cfg.gate.fidelity.length), cfg.seed)
    fid_ref = BaselineLogprobs.record(baseline, windows)
    fid = cfg.gate.fidelity
    groups = [("harmless", {"baseline itself (A/A)": VariantEngine, **HARMLESS}), ("broken", BROKEN), ("?", OTHER)]
    if args.onnxruntime:
        groups.insert(1, ("harmless", onnxruntime_engines(cfg, target, int(cfg.threads))))
    table = Table(title=f"generation agreement on known answers ({target.name}, {per_trial} prompts x {tokens} "
                        f"tokens a trial): pass = its gate decision")
    for col in ("variant", "should", "trials", "new: passed", "old exact: passed", "prompts agreed (new)",
                "identical", "teacher-forced top-1", "fidelity KL", "fidelity", "flips >= near_tie / flips"):
        table.add_column(col)
    for should, variants in groups:
        for name, build in variants.items():
            engine = build(model)
            reports = [ref.compare(engine, near_tie) for ref in refs]
            new = sum(agreement.judge(r, min_share, confidence).passed for r in reports)
            old = sum(agreement.lower_bound(r.exact, r.n_prompts, confidence) >= min_share for r in reports)
            fid_report = fid_ref.compare(engine)
            margins = flip_margins(fid_ref, engine)
            worst = margins.max() if len(margins) else 0.0
            n = sum(r.n_prompts for r in reports)
            row = (name, should, str(len(reports)), f"{new}/{len(reports)}", f"{old}/{len(reports)}",
                   f"{sum(r.agreed for r in reports)}/{n}", f"{sum(r.exact for r in reports)}/{n}",
                   f"{np.mean([r.forced_top1 for r in reports]):.3f}", f"{fid_report.kl_mean:.4f}",
                   "pass" if fidelity_judge(fid_report, fid.max_kl, fid.min_top1, confidence).passed else "fail",
                   f"{int((margins >= near_tie).sum())}/{len(margins)} (max {worst:.2f})")
            table.add_row(*row)
            console.print(" | ".join(row))
            getattr(engine, "close", lambda: None)()
    console.print(table)


if __name__ == "__main__":
    main()
