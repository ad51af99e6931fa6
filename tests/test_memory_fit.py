"""A model whose weights would not fit in memory at the recipe's dtype is refused before it is built, with both
figures: the rung (skipped), or the whole sweep when the baseline would not fit. Memory is faked small."""
import own_models
import pytest
from conftest import compose

from experiments.analyse import memory_fit
from experiments.core.errors import ConfigError
from experiments.core.recipe import Candidate, Recipe, Target


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return own_models.build(tmp_path_factory.mktemp("own") / "tiny-qwen2", "Qwen2ForCausalLM")


def params_of(folder):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())   # tied: counted once


def test_parameters_are_read_from_the_safetensors_headers(qwen):
    assert memory_fit.parameter_count(qwen) == params_of(qwen)


@pytest.mark.parametrize("recipe,per_param", [
    (Recipe(), 4), (Recipe(precision="bf16"), 2), (Recipe(precision="fp16"), 2),
    (Recipe(quantization="int8"), 1), (Recipe(precision="bf16", quantization="fp8"), 1),
    (Recipe(precision="bf16", quantization="int4"), 0.5)])
def test_bytes_per_parameter_follow_the_recipe(recipe, per_param):
    assert memory_fit.bytes_per_parameter(recipe) == per_param


def test_a_recipe_that_does_not_fit_is_refused_with_both_figures(qwen):
    params = memory_fit.parameter_count(qwen)
    fp32, int8 = Candidate(Target("q", "causal-lm", qwen)), Candidate(Target("q", "causal-lm", qwen),
                                                                      Recipe(quantization="int8"))
    between = int(params * 1 * memory_fit.MARGIN) + 1        # int8 fits, fp32 does not
    reason = memory_fit.refusal(fp32, between)
    assert reason.startswith("the weights of q need about 0.00 GiB at fp32") and f"{params / 1e6:.1f} M" in reason
    assert "x 4 bytes, +20% for activations" in reason and "(hardware.memory_bytes)" in reason
    assert memory_fit.refusal(int8, between) is None
    assert memory_fit.refusal(fp32) is None                  # a tiny model fits this machine's RAM


def test_a_rung_whose_weights_would_not_fit_is_skipped_before_it_is_built(qwen, tmp_path, monkeypatch):
    """In the rung's own process, right after apply: the memory check skips it, nothing is built."""
    from types import SimpleNamespace

    from experiments.climb import rung
    from optimizers.half_precision import HalfPrecision
    from optimizers.quantization import WeightQuantization

    params = memory_fit.parameter_count(qwen)
    cfg = compose([f"data_dir={tmp_path}", f"hardware.memory_bytes={int(params * 1.5 * memory_fit.MARGIN)}"])
    measured = []

    def measure(cand, sweep, name, apart):
        measured.append(name)
        raise RuntimeError("measured")
    monkeypatch.setattr(rung, "_measure", measure)
    monkeypatch.setattr(rung.tracking, "log_params", lambda *a: None)
    monkeypatch.setattr(rung.tracking, "set_tag", lambda *a: None)
    sweep = SimpleNamespace(cfg=cfg, env=_env(), gate=None, scorer=SimpleNamespace(reference=None), scores={},
                            ui=_Ui(), logs=tmp_path)
    current = Candidate(Target("q", "causal-lm", qwen))
    out, _, _ = rung._challenge("half_precision", HalfPrecision(), None, current, sweep, "r1")
    assert out.verdict.status == "skipped" and "at bf16" in out.verdict.reason, out.verdict.reason
    assert "hardware.memory_bytes" in out.verdict.reason and measured == []
    out, _, _ = rung._challenge("int8", WeightQuantization("int8"), None, current, sweep, "r1")   # 1 byte: fits
    assert measured == ["int8"] and out.verdict.reason == "RuntimeError: measured"


def test_the_sweeps_process_never_applies_a_rung_to_check_its_memory(qwen, tmp_path, monkeypatch):
    """apply may crash or hang: it runs in the rung's own process only (test_resilience's segfault rung once
    took the sweep down from here)."""
    from experiments.climb import rung
    from experiments.judge.gate import Verdict
    from optimizers.base import Optimizer

    class Crashing(Optimizer):
        cost = "zero"

        def apply(self, cand):
            pytest.fail("applied in the sweep's process")

    built = []
    monkeypatch.setattr(rung, "_challenge_isolated",
                        lambda name, *a: built.append(name) or rung.RungOutcome(name, Verdict("accepted", "built")))
    monkeypatch.setattr(rung.tracking, "run", _no_run)
    monkeypatch.setattr(rung.tracking, "set_tag", lambda *a: None)
    monkeypatch.setattr(rung.tracking, "set_tags", lambda *a: None)
    champion = type("Champion", (), {"candidate": Candidate(Target("q", "causal-lm", qwen)), "run_id": "r0"})()
    cfg = compose([f"data_dir={tmp_path}", "hardware.memory_bytes=1000"])
    sweep = type("Sweep", (), {"cfg": cfg, "env": _env(), "target": None, "experiment_id": "0"})()
    book = type("Book", (), {"started": lambda *a: None})()
    assert rung.climb("crashing", Crashing(), champion, sweep, book, "k").verdict.accepted
    assert built == ["crashing"]


def test_a_baseline_that_does_not_fit_stops_the_sweep_before_the_model_loads(qwen, tmp_path, monkeypatch):
    from experiments.climb import ladder
    from experiments.targets import kinds

    monkeypatch.setattr(kinds, "for_target", lambda *a: pytest.fail("the kind (tokenizer, data) was set up"))
    cfg = compose([f"data_dir={tmp_path}", "target=folder", f"target.source={qwen}", "hardware.memory_bytes=100000",
                   "tracking.uri=sqlite:///" + str(tmp_path / "mlflow.db")])
    with pytest.raises(ConfigError, match=r"the baseline cannot run here: the weights of tiny-qwen2 need about .* at "
                                          r"fp32 .* more than the 0.00 GiB of memory here \(hardware.memory_bytes\)"):
        ladder.run_sweep(cfg, _Ui())


def _env():
    from experiments.core.recipe import Env

    return Env(cuda=False, cuda_capability=None, cpu_count=2)


class _no_run:
    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return type("Run", (), {"info": type("Info", (), {"run_id": "r1"})()})()

    def __exit__(self, *exc):
        return False


class _Ui:
    def stage(self, _text):
        import contextlib

        @contextlib.contextmanager
        def stage():
            yield type("Stage", (), {"progress": staticmethod(lambda *a, **k: None)})()
        return stage()

    def note(self, _text):
        pass
