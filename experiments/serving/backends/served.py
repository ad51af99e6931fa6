"""What every serving engine shares: its server process, and the engine's side of the protocol over HTTP.

A served engine is built by starting its server (ServerProcess) for the candidate; the load ladder then drives
that server through our endpoint client (servers.serve gives an EndpointServer for it), lm-eval scores it
through `local-completions` against the same server, and fidelity and agreement read its prompt log-probs and
greedy answers. Nothing of the model runs in the ladder's processes.
"""
from __future__ import annotations

import functools
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from experiments.core.recipe import Candidate
from experiments.judge.fidelity import TopLogprobs
from experiments.serving.engine import Engine
from experiments.serving.environments import EngineEnvironment
from experiments.serving.http_client import EndpointServer
from experiments.serving.server_metrics import MetricNames, scrape
from experiments.serving.server_process import ServerProcess

# A proxy from the environment must not stand in for the server on 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
REQUEST_TIMEOUT_S = 600.0


class ServedEngine(Engine):
    """An engine whose model runs in a server process of its own. Subclasses say how to start it."""
    startup_timeout_s = 600.0
    top_k = 20                       # prompt log-probs per position the server returns (fidelity's basis)
    metric_names: MetricNames | None = None     # what its /metrics calls running, waiting, KV use, preemptions
    # its KV pool has a fixed memory budget whatever the KV type: fewer bits buy room for sequences, not memory
    fixed_kv_budget = False
    # its prompt or prefix cache is on when started as its users start it: the swap enters with it on (as deployed;
    # the load never repeats a prompt unless the workload does, so the cache cannot flatter the engine)
    caches_prefixes_by_default = False
    # the recipe's weight_format values it serves, beside its usual one per quantization
    weight_formats: tuple[str, ...] = ()

    def __init__(self, cand: Candidate, threads: int, artefact_root: Path, *, host: str = "127.0.0.1",
                 port: int | None = None):
        """host and port: where `roi-ladder serve` puts a champion; a measurement takes a free port on loopback."""
        self.require_buildable(cand)
        self.cand, self.recipe, self.threads = cand, cand.recipe, threads
        self.served_name, self.artefact_root = cand.target.name, Path(artefact_root)
        began = time.monotonic()
        command, env = self.server_command(cand, threads)
        command = [host if arg == "127.0.0.1" else arg for arg in command]
        self.environment_s = time.monotonic() - began
        log_path = Path(artefact_root) / "server-logs" / f"{self.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        self.process = ServerProcess(command, log_path, env=env, port=port)
        self.process.start(self.startup_timeout_s)
        self.startup_s = self.process.startup_s
        self.build_seconds = self.environment_s + self.startup_s

    # --- what a subclass says -------------------------------------------------------------------------
    def server_command(self, cand: Candidate, threads: int) -> tuple[list[str], dict[str, str]]:
        """(the server's command line with a `{port}` placeholder, its environment variables); may first create
        the engine's environment."""
        raise NotImplementedError

    def environment(self) -> EngineEnvironment | None:
        """The Python environment the server runs in (None: the engine builds something else, llama.cpp)."""
        return None

    def bounded_cache_mb(self) -> float | None:
        """The host memory (MB) its prompt cache grows to at most, where it keeps one with a cap (the soak: growth
        up to the cap is a bounded cache filling, not a leak); None where it keeps none."""
        return None

    def described(self) -> dict[str, str]:
        """What a deployment needs to run this server again: engine, version, command, environment."""
        out = {"engine": self.name, "command": " ".join(self.process.command), "log": str(self.process.log_path)}
        if (env := self.environment()) is not None:
            out.update(version=env.version, environment=str(env.folder()), requirements=" ".join(env.requirements))
        return out

    def weight_bits(self) -> float:
        """The server loads the target's weights at the recipe's dtype (fp8: quantized as it loads them)."""
        return 8.0 if self.recipe.quantization == "fp8" else {"fp32": 32.0}.get(self.recipe.precision, 16.0)

    # --- the Engine interface ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.process.url

    def endpoint(self, timeout_s: float) -> "ServedEndpoint":
        """What the load ladder drives (servers.serve): our endpoint client in front of the server."""
        return ServedEndpoint(self, timeout_s)

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Iterator[tuple[int, float]]:
        """Greedy, stop tokens ignored, one request; the seconds per token are the request's mean (a server
        does not report its compute per step)."""
        began = time.perf_counter()
        body = self._complete(prompt_ids, max_tokens=max_new_tokens, logprobs=1, ignore_eos=True)
        tokens = token_ids(body["choices"][0]["logprobs"]["tokens"])
        if len(tokens) != max_new_tokens:
            raise RuntimeError(f"{self.name} returned {len(tokens)} tokens of the {max_new_tokens} asked for")
        per_token = (time.perf_counter() - began) / max(1, len(tokens))
        for token in tokens:
            yield token, per_token

    def lm_eval_model(self, batch_size: int):
        from lm_eval.models.openai_completions import LocalCompletionsAPI  # heavy

        lm = LocalCompletionsAPI(model=self.served_name, base_url=f"{self.url}/v1/completions",
                                 tokenizer=str(self.cand.target.model_dir), tokenizer_backend="huggingface",
                                 tokenized_requests=True, batch_size=batch_size, max_length=self.context_length(),
                                 max_retries=1, timeout=int(REQUEST_TIMEOUT_S))
        lm._logprobs = ServerLogprobs(self, self.top_k)       # fidelity's scorer (fidelity.logprob_scorer)
        return lm

    def artefact_paths(self) -> list[Path]:
        # The server loads the target's own folder; nothing is exported.
        return sorted(Path(self.cand.target.model_dir).glob("*.safetensors"))

    def pause(self) -> None:
        """The gate's rounds stop the side not being measured: the server's whole group (isolation.Resident)."""
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()

    def close(self) -> None:
        self.process.stop()

    # --- helpers ----------------------------------------------------------------------------------------
    @functools.cached_property
    def tokenizer(self):
        """The target's tokenizer, for a promoted champion's text prompts (registry.CandidateModel)."""
        from transformers import AutoTokenizer  # heavy

        return AutoTokenizer.from_pretrained(self.cand.target.model_dir)

    def context_length(self) -> int:
        config = json.loads((Path(self.cand.target.model_dir) / "config.json").read_text())
        return int(config.get("max_position_embeddings", 2048))

    def _complete(self, prompt_ids: list[int], **fields) -> dict:
        """POST /v1/completions, greedy, vLLM's way of naming tokens by id."""
        return self._post("/v1/completions", {"model": self.served_name, "prompt": list(prompt_ids),
                                              "temperature": 0.0, "return_tokens_as_token_ids": True, **fields})

    def _post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(f"{self.url}{path}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with _OPENER.open(request, timeout=REQUEST_TIMEOUT_S) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{self.name} answered HTTP {exc.code}: {exc.read()[:300]!r}") from None
        except OSError as exc:
            if ended := self.process.died():
                raise RuntimeError(ended.describe(" during a request")) from None
            raise RuntimeError(f"{self.name} at {self.url} failed a request: {exc}") from None


def cuda_server_refusal(name: str, recipe) -> str | None:
    """What a CUDA-only server (SGLang, TensorRT-LLM) cannot take from a recipe, or None."""
    r = recipe
    if r.execution_provider != "cuda":
        return f"{name} serves on a CUDA device only; its PyPI build has no CPU backend"
    if r.compile != "none":
        return f"torch.compile compiles the torch engine; {name} compiles its own graphs"
    if r.precision not in ("fp32", "bf16", "fp16") or r.quantization not in ("none", "fp8"):
        return f"{name} here runs fp32, bf16 or fp16, with fp8 weights at most (not {r.quantization})"
    if r.kv_cache_dtype != "auto" or r.speculative != "none":
        return f"{name}'s KV-cache types and speculative decoding are not wired here yet"
    if r.batching in ("static", "dynamic"):
        return f"{name} batches continuously; its batching rung is server_batching"
    return None


def cuda_devices(recipe) -> dict[str, str]:
    """The devices one replica spans, from the one the champion was placed on."""
    devices = range(recipe.cuda_device, recipe.cuda_device + recipe.devices_per_replica)
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))}


class ServedEndpoint(EndpointServer):
    """Our endpoint client in front of a serving engine's server; it also names the server's processes (their
    CPU and memory are the engine's, ResourceSampler) and reads the server's own metrics."""

    def __init__(self, engine: ServedEngine, timeout_s: float):
        super().__init__(engine.url, engine.served_name, "ids", timeout_s=timeout_s)
        self.processes = engine.process.pids
        self._process = engine.process
        names = engine.metric_names
        self.server_probe = (lambda: scrape(engine.url, names)) if names else None

    def gone(self, when: str) -> str | None:
        """How the server ended `when`, with its log's last lines, if it did (a level's requests then fail to
        connect: the level is the server's failure, not a measurement)."""
        ended = self._process.died()
        return None if ended is None else ended.describe(f" {when}")


class ServerLogprobs:
    """token ids -> TopLogprobs (fidelity): the server's top-K prompt log-probs of the sequence, plus the top K
    after its last token (from the one token it is asked to generate)."""

    def __init__(self, engine: ServedEngine, top_k: int):
        self.engine, self.top_k = engine, top_k

    def __call__(self, tokens) -> TopLogprobs:
        tokens = [int(t) for t in tokens]
        body = self.engine._complete(tokens, max_tokens=1, prompt_logprobs=self.top_k, logprobs=self.top_k)
        choice = body["choices"][0]
        prompt = choice.get("prompt_logprobs")
        if not prompt or len(prompt) != len(tokens):
            raise RuntimeError(f"{self.engine.name} returned no prompt log-probs for {len(tokens)} tokens")
        rows = [_row(entry, self.top_k) for entry in prompt[1:]]          # position t+1's, after tokens[:t+1]
        rows.append(_row(_by_id(choice["logprobs"]["top_logprobs"][0]), self.top_k))
        followed = [_logprob(prompt[t + 1], tokens[t + 1]) for t in range(len(tokens) - 1)] + [np.nan]
        ids, lps = (np.array([r[i] for r in rows]) for i in (0, 1))
        return TopLogprobs(ids, lps, np.array(followed), np.array(tokens[1:] + [-1]))


def token_ids(tokens: list[str]) -> list[int]:
    """vLLM's `return_tokens_as_token_ids` spells each token as "token_id:123"."""
    return [int(t.rsplit(":", 1)[1]) for t in tokens]


def _by_id(top: dict) -> dict:
    """{"token_id:5": -0.1} (completion logprobs) -> {"5": {"logprob": -0.1}} (the prompt log-probs' shape)."""
    return {k.rsplit(":", 1)[1]: {"logprob": v} for k, v in top.items()}


def _row(entry: dict, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The K most likely tokens of one position, most likely first (the entry also holds the prompt's token,
    which may be outside them)."""
    pairs = sorted(((int(t), float(v["logprob"])) for t, v in entry.items()), key=lambda p: -p[1])[:k]
    if len(pairs) < k:
        raise RuntimeError(f"the server returned {len(pairs)} log-probs where {k} were asked for")
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def _logprob(entry: dict, token: int) -> float:
    return float(entry[str(token)]["logprob"])
