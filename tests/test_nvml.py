"""NVML samples the device the engine runs on, found by UUID (torch counts the devices CUDA_VISIBLE_DEVICES
leaves, NVML all of the machine's), and this process's own GPU memory where the driver reports it. A fake pynvml
and a pretend CUDA torch stand in for the GPU."""
import os
import subprocess
import sys
import time
import types

import pytest
import torch

from experiments.measure.resources import ResourceSampler

UUIDS = {0: "11111111-0000-0000-0000-000000000000", 1: "22222222-0000-0000-0000-000000000000"}


class NVMLError(Exception):
    pass


class NVMLError_NotFound(NVMLError):
    pass


def fake_nvml(monkeypatch, *, torch_device=1, nvml_names=None, processes=None):
    """A machine whose NVML sees four GPUs; CUDA_VISIBLE_DEVICES=2,3 shows NVML's 2 and 3 to torch as 0 and 1."""
    nvml_names = nvml_names or {2: f"GPU-{UUIDS[0]}", 3: f"GPU-{UUIDS[1]}"}
    used_by_device = {2: 1000 * 2**20, 3: 3000 * 2**20}
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError, nvml.NVMLError_NotFound = NVMLError, NVMLError_NotFound
    nvml.nvmlInit = lambda: None

    def by_uuid(name):
        for index, known in nvml_names.items():
            if known == name:
                return index
        raise NVMLError_NotFound(name)

    def by_index(index):
        raise AssertionError("NVML's index is not torch's: the handle must come from the UUID")

    nvml.nvmlDeviceGetHandleByUUID, nvml.nvmlDeviceGetHandleByIndex = by_uuid, by_index
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=40 + h)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used_by_device[h], total=80_000 * 2**20)
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: processes if processes is not None else [
        types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=700 * 2**20),
        types.SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=2000 * 2**20)]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: torch_device)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=UUIDS[i]))


def sample():
    with ResourceSampler(interval_s=0.01) as sampler:
        time.sleep(0.1)
    return sampler


def test_the_engines_device_is_found_by_uuid_not_by_torchs_index(monkeypatch):
    fake_nvml(monkeypatch, torch_device=1)
    sampler = sample()
    assert set(sampler.gpu_util) == {43.0}            # NVML's device 3, torch's cuda:1
    assert set(sampler.gpu_mem_mb) == {3000.0}


def test_this_process_gpu_memory_when_the_driver_reports_it(monkeypatch):
    fake_nvml(monkeypatch)
    summary = sample().summary()
    assert summary["gpu_proc_mem_mb_max"] == 700.0 and summary["gpu_mem_mb_max"] == 3000.0


@pytest.mark.parametrize("processes", [[], [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=None)]])
def test_no_per_process_figure_is_said_not_guessed(monkeypatch, processes):
    fake_nvml(monkeypatch, processes=processes)   # another PID namespace; or NVML_VALUE_NOT_AVAILABLE
    sampler = sample()
    assert sampler.summary()["gpu_proc_mem_mb_max"] is None and sampler.gpu_mem_mb
    assert "does not report the engine's processes' GPU memory" in sampler.series().gpu_proc_skipped


def test_a_servers_gpu_memory_is_its_processes_not_the_clients(monkeypatch):
    """A serving engine: the sampler runs in the client, the server's processes hold the device memory."""
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        fake_nvml(monkeypatch, processes=[types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=700 * 2**20),
                                          types.SimpleNamespace(pid=server.pid, usedGpuMemory=2000 * 2**20)])
        with ResourceSampler(interval_s=0.01, processes=lambda: [server.pid]) as sampler:
            time.sleep(0.1)
    finally:
        server.kill()
        server.wait()
    assert sampler.summary()["gpu_proc_mem_mb_max"] == 2000.0


def test_a_mig_instance_is_found_by_its_mig_uuid(monkeypatch):
    fake_nvml(monkeypatch, torch_device=0, nvml_names={2: f"MIG-{UUIDS[0]}"})
    assert set(sample().gpu_mem_mb) == {1000.0}


def test_a_device_nvml_does_not_know_fails_loudly(monkeypatch):
    fake_nvml(monkeypatch, torch_device=1, nvml_names={2: f"GPU-{UUIDS[0]}"})
    with pytest.raises(RuntimeError, match="NVML has no device with the UUID of torch's cuda:1"):
        ResourceSampler()
