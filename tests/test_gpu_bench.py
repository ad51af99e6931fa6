"""`make bench-gpu` on this CPU machine says "no CUDA" for every rung without building anything; on a pretend
H100 every rung it plans applies, on the GPU, from the right starting point (int4 from bf16)."""
import json
from pathlib import Path

from experiments.benchmarks import gpu_rungs
from experiments.core.recipe import Env, Target, device_name
from optimizers.baseline import EagerBaseline
from optimizers.placement import placed

H100 = Env(cuda=True, cuda_capability=(9, 0), cpu_count=16)


def test_without_cuda_each_rung_says_no_cuda(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(Env, "detect", classmethod(lambda cls: Env(False, None, 2)))
    monkeypatch.setenv("OUT", str(tmp_path))
    gpu_rungs.main([])
    printed = capsys.readouterr().out
    rows = json.loads((tmp_path / "gpu_rungs.json").read_text())
    assert list(rows) == list(gpu_rungs.RUNGS)
    assert all(r == {"status": "skipped", "reason": "no CUDA device on this machine"} for r in rows.values())
    assert printed.count("no CUDA device on this machine") == len(gpu_rungs.RUNGS)


def test_on_a_gpu_every_planned_rung_applies_there(monkeypatch, tmp_path):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())   # the gpu extra "installed"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    base = EagerBaseline().apply(placed(Target("tiny-llm", "causal-lm", Path(tmp_path)), "cuda", H100))
    plan = gpu_rungs.gpu_candidates(base)
    assert tuple(plan) == gpu_rungs.RUNGS
    for name, (rung, start) in plan.items():
        assert rung is None or rung.check(H100, start) is None, name
        cand = rung.apply(start) if rung else start
        assert device_name(cand.recipe) == "cuda:0", name
    assert plan["int4 (torchao)"][1].recipe.precision == "bf16"
