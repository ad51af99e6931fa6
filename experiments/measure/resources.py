"""What a serving process costs while it runs: CPU, resident memory, GPU utilisation and memory (NVML), KV blocks."""
from __future__ import annotations

import threading

import numpy as np
import psutil
import torch

from experiments.core.reports import ResourceSeries
from experiments.serving import server_metrics


class ResourceSampler:
    """CPU utilisation and RSS of this (serving) process, GPU utilisation and memory through NVML when a CUDA
    device is present, and the KV blocks a paged-cache server holds, sampled in the background. For a serving
    engine, `processes()` gives its server's processes, whose CPU and RSS are summed instead of this one's (here
    only the client runs), and `server_probe()` reads its own metrics (server_metrics.scrape) once a second."""
    SERVER_EVERY = 4                    # samples: /metrics is read once a second, not at every 0.25 s sample

    def __init__(self, interval_s: float = 0.25, kv_probe=None, processes=None, server_probe=None):
        self.interval_s = interval_s
        self._processes, self._server_probe = processes, server_probe
        self._seen: dict[int, psutil.Process] = {}
        self.server: list[dict[str, float]] = []
        self.cpu: list[float] = []
        self.rss_mb: list[float] = []
        self.gpu_util: list[float] = []
        self.gpu_mem_mb: list[float] = []
        self.kv_mb: list[float] = []
        self.host_mem_percent: list[float] = []
        self.gpu_mem_total_mb: float | None = None
        self.gpu_proc_mem_mb: list[float] = []   # this process's own share, where the driver reports it
        self.gpu_skipped = ""
        self.gpu_proc_skipped = ""
        self._kv_probe = kv_probe
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._gpu = self._nvml_handle()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _nvml_handle(self):
        if not torch.cuda.is_available():
            self.gpu_skipped = "no CUDA device: GPU sampling not applicable here"
            return None
        try:
            import pynvml  # optional
        except ImportError:
            self.gpu_skipped = "nvidia-ml-py is not installed (pip install -e '.[gpu]')"
            return None
        pynvml.nvmlInit()
        # the engine made its device the current one (TorchEngine, TorchEncoder)
        return nvml_handle(pynvml, torch.cuda.current_device())

    def _sample_gpu(self, watched: list[psutil.Process]) -> None:
        import pynvml  # optional

        self.gpu_util.append(float(pynvml.nvmlDeviceGetUtilizationRates(self._gpu).gpu))
        memory = pynvml.nvmlDeviceGetMemoryInfo(self._gpu)
        self.gpu_mem_mb.append(memory.used / 2**20)
        self.gpu_mem_total_mb = memory.total / 2**20
        if self.gpu_proc_skipped:
            return
        # the engine's processes (a server's, for a serving engine): the device also holds a paused rival's
        mine = process_gpu_memory(pynvml, self._gpu, {proc.pid for proc in watched})
        if mine is None:
            self.gpu_proc_skipped = ("the driver does not report the engine's processes' GPU memory (a container's "
                                     "PID namespace, or a MIG or vGPU device): device-wide memory only")
        else:
            self.gpu_proc_mem_mb.append(mine / 2**20)

    def __enter__(self):
        for proc in self._watched():
            proc.cpu_percent(None)
        self._thread.start()
        return self

    def _watched(self) -> list[psutil.Process]:
        if self._processes is None:
            return [self._proc]
        pids = set(self._processes())
        for pid in pids - set(self._seen):
            try:
                self._seen[pid] = psutil.Process(pid)
                self._seen[pid].cpu_percent(None)     # its first reading says nothing; from now on it counts
            except psutil.Error:
                pass
        return [self._seen[pid] for pid in pids if pid in self._seen]

    def _cpu_and_rss(self, watched: list[psutil.Process]) -> tuple[float, float]:
        cpu = rss = 0.0
        for proc in watched:
            try:
                cpu, rss = cpu + proc.cpu_percent(None), rss + proc.memory_info().rss
            except psutil.Error:
                pass                                  # ended meanwhile
        return cpu, rss

    def _run(self):
        tick = 0
        while not self._stop.wait(self.interval_s):
            watched = self._watched()
            cpu, rss = self._cpu_and_rss(watched)
            self.cpu.append(cpu)
            self.rss_mb.append(rss / 2**20)
            if self._server_probe is not None and tick % self.SERVER_EVERY == 0:
                try:
                    self.server.append(self._server_probe())
                except OSError:
                    pass                              # a missed reading; a dead server shows in the requests
            tick += 1
            self.host_mem_percent.append(psutil.virtual_memory().percent)
            if self._gpu is not None:
                self._sample_gpu(watched)
            usage = self._kv_probe() if self._kv_probe else None
            if usage is not None:
                self.kv_mb.append(usage.mb_in_use)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def series(self) -> ResourceSeries:
        return ResourceSeries(self.interval_s, tuple(self.cpu), tuple(self.rss_mb), tuple(self.host_mem_percent),
                              tuple(self.gpu_util), tuple(self.gpu_mem_mb), self.gpu_mem_total_mb,
                              psutil.cpu_count() or 1, self.gpu_skipped, tuple(self.gpu_proc_mem_mb),
                              self.gpu_proc_skipped)

    def summary(self) -> dict[str, float | None]:
        mean = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
        peak = lambda xs: float(max(xs)) if xs else None  # noqa: E731
        return {"cpu_percent_mean": mean(self.cpu) or 0.0,
                # a level shorter than one sample: one reading now, of the same processes
                "rss_mb_max": peak(self.rss_mb) or self._cpu_and_rss(self._watched())[1] / 2**20,
                "gpu_util_mean": mean(self.gpu_util), "gpu_mem_mb_max": peak(self.gpu_mem_mb),
                "gpu_proc_mem_mb_max": peak(self.gpu_proc_mem_mb), "kv_mb_max": peak(self.kv_mb),
                "server_metrics": server_metrics.summarize(self.server) if self._server_probe else None}


def nvml_handle(pynvml, torch_index: int):
    """NVML's handle for torch's cuda:<torch_index>. NVML numbers every device of the machine; torch numbers those
    CUDA_VISIBLE_DEVICES leaves, in CUDA_DEVICE_ORDER: the UUID is the one name both give the same device."""
    uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
    # torch prints the bare UUID; NVML names a GPU "GPU-<uuid>" and a MIG instance "MIG-<uuid>"
    names = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
    for name in names:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(name)
        except pynvml.NVMLError_NotFound:
            continue
    raise RuntimeError(f"NVML has no device with the UUID of torch's cuda:{torch_index} ({uuid})")


def process_gpu_memory(pynvml, handle, pids: set[int]) -> int | None:
    """Bytes of GPU memory `pids` hold on the device, or None when the driver does not say: NVML lists compute
    processes by host PID (a container sees other numbers) and reports no per-process figure on some devices."""
    used = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in pids]
    if not used or any(u is None for u in used):
        return None
    return sum(used)
