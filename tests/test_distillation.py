"""The distillation rung: a real student (fewer layers, learned from the teacher), cached, and run on evidence."""
import json
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from experiments.core.cache import manifest_ok
from experiments.core.recipe import Candidate, Env, Recipe, Target
from experiments.core.slo import SLO
from experiments.targets.models.corpus import Corpus
from experiments.targets.models.student import (
    DistillSettings,
    distill,
    init_student,
    kept_layers,
    mean_kl,
    student_key,
    token_stream,
)
from optimizers.distillation import Distillation
from tests.conftest import compose

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
# Few steps and a small batch: enough to show learning in seconds; the YAML defaults train longer.
QUICK = DistillSettings(student_layers=2, steps=40, seq_len=128, batch_size=8, lr=1e-3, temperature=2.0, alpha=0.9,
                        seed=0)


@pytest.fixture(scope="module")
def corpus():
    return Corpus.from_stdlib(8)


@pytest.fixture(scope="module")
def student_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def distilled(model_dir, corpus, student_cache):
    return distill(model_dir, corpus.train, QUICK, student_cache, threads=2, progress=print)


@pytest.fixture(scope="module")
def teacher(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def heldout_windows(model_dir, corpus):
    from transformers import AutoTokenizer

    stream = token_stream(AutoTokenizer.from_pretrained(model_dir), corpus.heldout[:24])
    starts = torch.randint(0, len(stream) - 128, (12,), generator=torch.Generator().manual_seed(7))
    return [stream[s: s + 128] for s in starts.tolist()]


# --- the student ------------------------------------------------------------------------------------------
def test_kept_layers_are_evenly_spaced_from_first_to_last():
    assert kept_layers(4, 2) == (0, 3)
    assert kept_layers(4, 3) == (0, 2, 3)
    assert kept_layers(12, 4) == (0, 4, 7, 11)
    assert kept_layers(4, 1) == (3,)
    with pytest.raises(ValueError, match="1..3 layers"):
        kept_layers(4, 4)


def test_student_starts_as_a_copy_of_the_kept_teacher_layers(teacher):
    student, keep = init_student(teacher, 2)
    assert student.config.num_hidden_layers == 2 and len(student.model.layers) == 2
    assert teacher.config.num_hidden_layers == 4            # the teacher's config is not touched
    for j, i in enumerate(keep):
        for (name, p), (_, q) in zip(student.model.layers[j].named_parameters(),
                                     teacher.model.layers[i].named_parameters()):
            assert torch.equal(p, q), name
    assert torch.equal(student.model.embed_tokens.weight, teacher.model.embed_tokens.weight)
    assert torch.equal(student.model.norm.weight, teacher.model.norm.weight)
    assert student.model.embed_tokens.weight.data_ptr() != teacher.model.embed_tokens.weight.data_ptr()


def test_student_folder_has_fewer_layers_and_loads(distilled, model_dir):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = distilled.path
    assert not distilled.reused and out.parent.name == "students"
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        layers = {int(k.split(".")[2]) for k in f.keys() if k.startswith("model.layers.")}
    assert layers == {0, 1}
    assert distilled.kept_layers == (0, 3) and distilled.teacher_layers == 4
    assert distilled.parameters < distilled.teacher_parameters
    assert (out / "model.safetensors").stat().st_size < (Path(model_dir) / "model.safetensors").stat().st_size
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (Path(model_dir) / name).read_bytes(), name
    assert manifest_ok(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 2
    assert sum(p.numel() for p in model.parameters()) == distilled.parameters
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("def f(x):")["input_ids"] == AutoTokenizer.from_pretrained(model_dir)("def f(x):")["input_ids"]


def test_student_learned_from_the_teacher(distilled, teacher, heldout_windows):
    from transformers import AutoModelForCausalLM

    untrained, _ = init_student(teacher, 2)
    trained = AutoModelForCausalLM.from_pretrained(distilled.path).eval()
    kl_untrained = mean_kl(teacher, untrained.eval(), heldout_windows)
    kl_trained = mean_kl(teacher, trained, heldout_windows)
    print(f"held-out KL(teacher || student): untrained {kl_untrained:.4f}, after {QUICK.steps} steps {kl_trained:.4f}")
    assert kl_trained < 0.7 * kl_untrained
    assert 0 < mean_kl(teacher, teacher, heldout_windows[:2]) + 1e-6 < kl_trained   # the measure itself is sane


def test_unchanged_rerun_reuses_the_student(distilled, model_dir, corpus, student_cache):
    started = time.perf_counter()
    again = distill(model_dir, corpus.train, QUICK, student_cache, threads=2)
    assert again.reused and again.path == distilled.path
    assert time.perf_counter() - started < 10
    assert again.final_kd_loss == distilled.final_kd_loss and again.train_seconds == distilled.train_seconds


def test_key_follows_settings_texts_and_teacher(model_dir, corpus, tmp_path):
    import shutil
    from dataclasses import replace

    key = student_key(model_dir, corpus.train, QUICK)
    assert student_key(model_dir, corpus.train, QUICK) == key
    assert student_key(model_dir, corpus.train, replace(QUICK, steps=41)) != key
    assert student_key(model_dir, corpus.train[:-1], QUICK) != key
    copy = shutil.copytree(model_dir, tmp_path / "teacher")
    assert student_key(copy, corpus.train, QUICK) == key         # content, not path
    (copy / "model.safetensors").write_bytes((copy / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    assert student_key(copy, corpus.train, QUICK) != key


def test_corrupted_cached_student_is_rebuilt(model_dir, corpus, tmp_path):
    tiny = DistillSettings(2, 2, 32, 2, 1e-3, 2.0, 0.5, 0)
    first = distill(model_dir, corpus.train[:20], tiny, tmp_path)
    weights = first.path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    second = distill(model_dir, corpus.train[:20], tiny, tmp_path)
    assert not second.reused and second.path == first.path and manifest_ok(second.path)
    assert not list(tmp_path.glob("students/*.partial-*"))


def test_settings_are_validated():
    with pytest.raises(ValueError, match="temperature > 0.*0 <= alpha <= 1"):
        DistillSettings(2, 10, 128, 8, 1e-3, 0.0, 1.5, 0)


# --- the rung's decision: only when the evidence says the model layer is the bottleneck -------------------
class FakeLevel:
    """A benchmark level: per-request values for the SLOs, and mean stats for the model share."""

    def __init__(self, concurrency, model_ms, e2e_ms):
        self.concurrency = concurrency
        self._e2e = np.full(50, float(e2e_ms))
        self.stats = {"model_ms": SimpleNamespace(mean=float(model_ms)), "e2e_ms": SimpleNamespace(mean=float(e2e_ms))}

    def values(self, metric):
        return self._e2e if metric == "e2e_ms" else np.array([])


def bench(levels, slos=(), capacity=None):
    return SimpleNamespace(levels=tuple(FakeLevel(*lv) for lv in levels), slos=tuple(SLO.parse(s) for s in slos),
                           capacity=None if capacity is None else SimpleNamespace(concurrency=capacity))


def rung(**kw):
    args = dict(asdict(QUICK), threads=2, cache_dir="/unused", stdlib_heldout_every=8,
                accuracy_tasks=["tiny_llm_nextline"])
    opt = Distillation(**{**args, **kw})
    opt.name = "distillation"
    return opt


def decide(opt, tiny_target, evidence):
    opt.observe(SimpleNamespace(bench=evidence))
    return opt.check(CPU, Candidate(tiny_target).edited("baseline"))


def test_skips_with_the_numbers_when_the_model_is_a_small_share(tiny_target):
    reason = decide(rung(), tiny_target, bench([(1, 9, 10), (8, 12, 40)], ["p95_e2e_ms<=20"]))
    assert "not the bottleneck" in reason and "30% of mean E2E at c=8 (12.0 of 40.0 ms)" in reason
    assert "below model_share_min 70%" in reason and "missed p95_e2e_ms<=20 at c=8" in reason


def test_skips_with_the_numbers_when_every_slo_is_met(tiny_target):
    reason = decide(rung(), tiny_target, bench([(1, 9, 10), (8, 36, 40)], ["p95_e2e_ms<=50"]))
    assert "every SLO (p95_e2e_ms<=50) is met at every level up to c=8" in reason and "90%" in reason
    reason = decide(rung(), tiny_target, bench([(1, 9, 10), (8, 36, 40)]))
    assert "no SLOs are set" in reason


def test_runs_when_the_model_is_the_bottleneck_and_the_sla_unmet(tiny_target):
    opt = rung()
    assert decide(opt, tiny_target, bench([(1, 9, 10), (8, 36, 40)], ["p95_e2e_ms<=20"])) is None
    assert "model layer is the bottleneck" in opt.decision and "missed p95_e2e_ms<=20 at c=8" in opt.decision
    # SLA capacity below the top level counts as unmet too, even when the measured levels met the SLOs.
    assert decide(opt, tiny_target, bench([(1, 9, 10), (8, 36, 40)], ["p95_e2e_ms<=50"], capacity=4)) is None
    assert "SLA capacity c=4 is below the top level c=8" in opt.decision


def test_force_overrides_the_evidence_and_records_it(tiny_target):
    opt = rung(force=True)
    assert decide(opt, tiny_target, bench([(1, 1, 10), (8, 4, 40)])) is None
    assert opt.decision.startswith("forced") and "10% of mean E2E" in opt.decision
    opt.observe(None)
    assert opt.check(CPU, Candidate(tiny_target)) is None and "no benchmark of the champion" in opt.decision


def test_skips_without_evidence_or_where_it_cannot_apply(tiny_target):
    opt = rung()
    opt.observe(None)
    assert "no benchmark of the champion" in opt.check(CPU, Candidate(tiny_target))
    no_model_time = bench([(1, 9, 10)])
    no_model_time.levels[0].stats["model_ms"] = None
    assert "no model time" in decide(rung(), tiny_target, no_model_time)
    hot = bench([(1, 9, 10), (8, 36, 40)], ["p95_e2e_ms<=20"])
    assert "not fewer than the champion's 4" in decide(rung(student_layers=4, force=True), tiny_target, hot)
    assert "no quality bar" in decide(rung(accuracy_tasks=[], force=True), tiny_target, hot)
    opt = rung(force=True)
    opt.observe(SimpleNamespace(bench=hot))
    assert "already a distilled student" in opt.check(CPU, Candidate(tiny_target).edited("distillation"))
    embedding = Candidate(Target("m", "embedding", tiny_target.model_dir))
    assert "causal-LM student" in opt.check(CPU, embedding) and "encoder" in opt.check(CPU, embedding)


def test_rung_is_built_from_its_yaml(tmp_path):
    from experiments.climb.validation import load_rungs

    cfg = compose([f"data_dir={tmp_path}"])
    name, opt = load_rungs(cfg)[-1]
    assert name == "distillation" and isinstance(opt, Distillation) and opt.cost == "high"
    assert opt.cache_dir == Path(cfg.cache_dir) and opt.threads == cfg.threads and opt.settings.seed == cfg.seed
    assert opt.sources.stdlib_heldout_every == cfg.target.build.heldout_every and opt.force is False
    assert opt.sources.tasks == tuple(cfg.accuracy.tasks) == ("tiny_llm_nextline",)
    assert opt.student_layers_for(cfg.target.build.num_layers) == cfg.target.build.num_layers // 2   # null: half


def test_any_causal_lm_gets_a_half_depth_student_and_only_the_builtins_train_on_the_stdlib():
    """The built-ins' students learn from the standard library's training split (tiny-llm was trained on it; their
    prompts and fidelity windows are its held-out files); a user's folder, from its own text."""
    from experiments.climb.validation import load_rungs

    for target in ("smollm2", "folder"):
        overrides = ["target.source=/nowhere"] if target == "folder" else []
        opt = dict(load_rungs(compose([f"target={target}", *overrides])))["distillation"]
        assert opt.sources.stdlib_heldout_every == (8 if target == "smollm2" else None)
        assert opt.student_layers_for(30) == 15 and opt.student_layers_for(1) == 1
        assert (opt.settings.steps, opt.settings.batch_size) == ((40, 4) if target == "smollm2" else (160, 16))


# --- apply: the champion's recipe, run on the student's folder ----------------------------------------------
def test_apply_points_the_champion_recipe_at_the_student(distilled, tiny_target, student_cache):
    from experiments.serving import build_engine

    opt = rung(cache_dir=str(student_cache))
    champion = Candidate(tiny_target).edited("baseline", precision="fp32")
    challenger = opt.apply(champion)
    assert opt.result.reused and challenger.target.model_dir == distilled.path
    assert challenger.recipe == champion.recipe and challenger.rungs == ("baseline", "distillation")
    assert challenger.target.name == champion.target.name and champion.target.model_dir == tiny_target.model_dir
    engine = build_engine(challenger, 2, student_cache / "artefacts")
    try:
        assert engine.model.config.num_hidden_layers == 2
        tokens = [t for t, _ in engine.generate(engine.tokenizer("import os\n")["input_ids"], 8)]
        assert 1 <= len(tokens) <= 8
    finally:
        engine.close()


@pytest.mark.slow
def test_default_settings_distill_the_builtin_model_and_run_in_onnxruntime(model_dir, corpus, teacher,
                                                                         heldout_windows, tmp_path):
    """The YAML's defaults end to end: time, KL before and after, and the ONNX Runtime export of the student."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from experiments.serving import build_engine

    cfg = OmegaConf.load(Path(__file__).parent.parent / "conf" / "rung" / "distillation.yaml")
    settings = DistillSettings(**{k: cfg[k] for k in ("steps", "seq_len", "batch_size", "lr", "temperature",
                                                         "alpha")}, seed=0,
                               student_layers=cfg.student_layers or teacher.config.num_hidden_layers // 2)
    result = distill(model_dir, corpus.train, settings, tmp_path, threads=2, progress=print)
    untrained, _ = init_student(teacher, settings.student_layers)
    kl_before = mean_kl(teacher, untrained.eval(), heldout_windows)
    kl_after = mean_kl(teacher, AutoModelForCausalLM.from_pretrained(result.path).eval(), heldout_windows)
    print(f"default distillation: {result.train_seconds} s for {settings.steps} steps; "
          f"KL untrained {kl_before:.4f} -> trained {kl_after:.4f}; {result.parameters} of "
          f"{result.teacher_parameters} parameters")
    assert kl_after < 0.5 * kl_before
    cand = Candidate(Target("tiny-llm", "causal-lm", result.path), Recipe(engine="onnxruntime"), ("distillation",))
    engine = build_engine(cand, 2, tmp_path / "artefacts")
    try:
        tokens = [t for t, _ in engine.generate(engine.tokenizer("import os\n")["input_ids"], 8)]
        assert 1 <= len(tokens) <= 8
    finally:
        engine.close()
