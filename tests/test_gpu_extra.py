"""One installable GPU set: the `gpu` extra resolves with the CUDA torch 2.14.1 pair, torch-tensorrt 2.14, torchao,
ONNX Runtime's CUDA builds and NVML, beside the base pins, without a GPU: pip's dry run reads metadata only.

TensorRT's own wheels are on NVIDIA's index only: PyPI's tensorrt-cu13 and tensorrt-cu13-libs are stubs that fetch
from pypi.nvidia.com while pip prepares their metadata. Where that index answers the whole extra is resolved as
`make setup` installs it; where it does not (this sandbox reaches PyPI only) the rest is resolved with
torch-tensorrt's own PyPI requirements in its place, and the NVIDIA-only part is skipped with that reason."""
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
NVIDIA_INDEX = "https://pypi.nvidia.com"
NVIDIA_ONLY = {"tensorrt-cu13", "tensorrt-cu13-libs"}   # PyPI serves stubs for these, not wheels


def extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {"base": [Requirement(r) for r in project["dependencies"]],
            **{k: [Requirement(r) for r in v] for k, v in project["optional-dependencies"].items()}}


def test_cpu_and_gpu_builds_are_extras_and_the_base_pins_neither():
    deps = extras()
    names = lambda reqs: {r.name for r in reqs}  # noqa: E731
    builds = {"torch", "onnxruntime", "onnxruntime-genai"}
    assert not builds & names(deps["base"])
    assert builds <= names(deps["cpu"])
    gpu = {r.name: r for r in deps["gpu"]}
    assert str(gpu["torch"].specifier) == "==2.14.1" and str(gpu["torchvision"].specifier) == "==0.29.1"
    assert {"torch-tensorrt", "torchao", "onnxruntime-gpu", "onnxruntime-genai-cuda", "nvidia-ml-py"} <= set(gpu)
    assert "mslk" not in gpu   # PyPI's mslk is an empty 0.0.0 placeholder; the int4 layout used needs none
    assert "'.[dev,$(BUILD)]'" in (REPO / "Makefile").read_text()


def _reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=10).close()
        return True
    except OSError:
        return False


def dry_run(tmp_path, *args) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--report", str(report), *args], cwd=REPO, capture_output=True, text=True, timeout=1500)
    resolved = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]
                for i in json.loads(report.read_text())["install"]} if report.exists() else {}
    return proc, resolved


def _check_gpu_set(resolved: dict) -> None:
    assert resolved["torch"]["version"] == "2.14.1" and resolved["torchvision"]["version"] == "0.29.1"
    assert "onnxruntime-gpu" in resolved and "onnxruntime" not in resolved   # one ONNX Runtime, the CUDA one
    assert "onnxruntime-genai" not in resolved


@pytest.mark.slow
def test_the_gpu_extra_resolves_with_nvidias_index(tmp_path):
    if not _reachable(f"{NVIDIA_INDEX}/tensorrt-cu13-libs/"):
        pytest.skip(f"{NVIDIA_INDEX} is unreachable from here: TensorRT's wheels are served there only "
                    f"(test_the_gpu_extra_resolves_from_pypi checks the rest)")
    proc, resolved = dry_run(tmp_path, "-e", ".[dev,gpu]", "--extra-index-url", NVIDIA_INDEX)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_gpu_set(resolved)
    assert resolved["torch-tensorrt"]["version"] == "2.14.0"


@pytest.mark.slow
def test_the_gpu_extra_resolves_from_pypi(tmp_path):
    """The extra with torch-tensorrt replaced by its own requirements that PyPI serves as wheels."""
    if not _reachable("https://pypi.org/simple/torch-tensorrt/"):
        pytest.skip("PyPI is unreachable from here")
    gpu = extras()["gpu"]
    trt = next(r for r in gpu if r.name == "torch-tensorrt")
    proc, meta = dry_run(tmp_path, "--no-deps", str(trt))
    assert proc.returncode == 0, proc.stderr[-3000:]
    trt_needs = [Requirement(r) for r in meta["torch-tensorrt"]["requires_dist"]]
    trt_needs = [r for r in trt_needs if r.marker is None and r.name not in NVIDIA_ONLY]
    rest = [str(r) for r in gpu if r.name != "torch-tensorrt"] + [str(r) for r in trt_needs]
    proc, resolved = dry_run(tmp_path, "-e", ".", *rest)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_gpu_set(resolved)
    for need in trt_needs:   # what torch-tensorrt asks of the set, the set gives
        assert need.specifier.contains(resolved[need.name.lower().replace("_", "-")]["version"]), need
