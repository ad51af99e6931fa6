"""make bench-gate's accuracy scenarios (experiments/benchmarks/gate_quality.py): a ~2-point drop the gate must
reject, and a harmless change it must accept, both as Gaussian noise on the decoder's weights, judged by the
gate's accuracy criterion (lm-eval, paired) and its fidelity criterion (KL / top-1 against the clean model)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from experiments.core.recipe import Candidate
from experiments.judge.accuracy import evaluate
from experiments.judge.fidelity import BaselineLogprobs, judge
from experiments.judge.gate import Gate
from experiments.serving import build_engine

TARGET_DROP = 0.02                        # points of the gate's accuracy metric
CALIBRATION_SIGMAS = (0.5, 1.0, 1.5, 2.0)  # noise sd in units of each weight matrix's own sd
CALIBRATION_SEEDS = (10_001, 10_002)      # apart from the measured seeds 0..N-1
HARMLESS_GOAL = 0.90
HARMLESS_SCALE = 0.25                     # of the calibrated noise scale: answers flip, the mean does not drop


class DecoderNoise:
    """Test-only: Gaussian noise on the decoder layers' weight matrices (not the embedding, nor the tied head)."""

    def __init__(self, model):
        self.params = [p for p in model.model.layers.parameters() if p.dim() == 2]
        self.clean = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def apply(self, sigma: float, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for p, clean in zip(self.params, self.clean):
            p.copy_(clean + sigma * clean.std() * torch.randn(clean.shape, generator=gen))

    @torch.no_grad()
    def restore(self) -> None:
        for p, clean in zip(self.params, self.clean):
            p.copy_(clean)


def accuracy(cfg, gate: Gate, base: Candidate, include_path: Path, windows, n: int, sigmas, console,
             scenarios=("drop", "harmless"), sigma: float | None = None, first_seed: int = 0,
             accuracy_alone: bool = False):
    """Per noise seed, at the calibrated scale ("drop") and at HARMLESS_SCALE of it ("harmless"): (the accuracy
    criterion, the fidelity criterion, documents whose score changed) against the clean model. `sigma` given
    skips the calibration (it is deterministic: fixed seeds, the first look's documents). Seeds first_seed ...
    first_seed + n - 1: runs over other seed ranges add up, so that two processes can share the seeds.
    accuracy_alone: the accuracy criterion goes to its last look wherever the first is undecided, whatever
    fidelity says, as for a rung judged on accuracy alone (distillation): its own power."""
    engine = build_engine(base, int(cfg.threads), Path(cfg.cache_dir) / "artefacts")
    noise = DecoderNoise(engine.model)
    fid = cfg.gate.fidelity

    def measure(first_look=None, doc_ids=None):
        return evaluate(engine.lm_eval_model(int(cfg.accuracy.batch_size)), list(cfg.accuracy.tasks),
                        cfg.gate.accuracy.metric, include_path, cfg.accuracy.limit, cfg.seed,
                        first_look=first_look, doc_ids=doc_ids)[0]

    def gated(champion, fidelity):
        """As a rung's gate judges: the first look, and the rest of the documents where it is undecided and
        no other criterion (here fidelity) has failed."""
        scored = measure(first_look=cfg.accuracy.get("first_look"))
        acc = gate.accuracy(champion, scored)
        if acc.undecided and (fidelity.passed or accuracy_alone):
            scored = scored.extended(measure(doc_ids=scored.missing()))
            acc = gate.accuracy(champion, scored)
        return scored, acc

    try:
        champion = measure()
        reference = BaselineLogprobs.record(engine, windows)
        console.print(f"  champion {champion.task} {champion.metric} = {champion.value:.4f} "
                      f"(n = {len(champion.per_doc)} documents)", highlight=False)
        if sigma is None:
            sigma, how = calibrate(_calibration(noise, champion, sigmas, measure, cfg, console))
        else:
            how = "given with --sigma, not calibrated in this run"
        console.print(f"  noise: sigma {sigma:.3f} for a {TARGET_DROP:.2f} drop ({how})", highlight=False)
        judged = {"drop": [], "harmless": []}
        for label, scale in (("drop", sigma), ("harmless", sigma * HARMLESS_SCALE)):
            if label not in scenarios:
                continue
            for seed in range(first_seed, first_seed + n):
                noise.apply(scale, seed)
                fidelity = judge(reference.compare(engine), fid.max_kl, fid.min_top1, cfg.gate.confidence)
                scored, acc = gated(champion, fidelity)
                flips = int(np.count_nonzero(_paired(champion, scored)))
                judged[label].append((acc, fidelity, flips))
                c, f = acc.numbers, fidelity.numbers
                console.print(f"  {label} (sigma {scale:.3f}) seed {seed}: {flips} of {len(scored.per_doc)} documents "
                              f"changed, drop {c['drop']:+.4f} se {c['drop_se']:.4f} upper {c['drop_upper']:+.4f} -> "
                              f"{_verdict(acc)};  KL {f['kl_mean']:.3g} top-1 "
                              f"{f['top1_agreement']:.3f} -> {'pass' if fidelity.passed else 'REJECT'}",
                              highlight=False)
        return sigma, judged["drop"], judged["harmless"]
    finally:
        noise.restore()
        engine.close()


def _calibration(noise, champion, sigmas, measure, cfg, console) -> list[tuple[float, float]]:
    """(sigma, mean drop over CALIBRATION_SEEDS) on the first look's documents, for each sigma of the grid."""
    points = []
    for sigma in sigmas:
        drops = []
        for seed in CALIBRATION_SEEDS:
            noise.apply(sigma, seed)
            drops.append(float(np.mean(_paired(champion, measure(first_look=cfg.accuracy.get("first_look"))))))
        points.append((sigma, float(np.mean(drops))))
        console.print(f"  calibration: sigma {sigma:.3g} -> drop {points[-1][1]:+.4f} "
                      f"(seeds {', '.join(f'{d:+.4f}' for d in drops)})", highlight=False)
    return points


def _verdict(acc) -> str:
    if acc.undecided:
        return "undecided (first look; the rest not scored: fidelity failed)"
    return "pass" if acc.passed else "REJECT"


def _paired(champion, scored) -> np.ndarray:
    """champion - scored, per document that `scored` has."""
    return champion.at(scored.ids) - np.asarray(scored.per_doc)


def calibrate(points) -> tuple[float, str]:
    """The noise scale whose mean drop is TARGET_DROP, interpolated in log(sigma) on the grid's mean drops,
    made non-decreasing first (more noise cannot help on average; a dip is seed noise)."""
    sigmas, drops = np.array(points).T
    drops = np.maximum.accumulate(drops)
    if not drops[0] <= TARGET_DROP <= drops[-1]:
        raise RuntimeError(f"the calibration grid {sigmas.tolist()} does not bracket a {TARGET_DROP} drop "
                           f"(mean drops {', '.join(f'{d:+.4f}' for d in drops)}): widen it")
    sigma = float(np.exp(np.interp(TARGET_DROP, drops, np.log(sigmas))))
    return sigma, "interpolated in log(sigma) on the non-decreasing grid means"
