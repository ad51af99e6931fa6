"""`roi-ladder serve`: a candidate (baseline + named rungs) as an OpenAI-compatible endpoint; and
`roi-ladder bench --endpoint`: the target's workload and load ladder against any such endpoint, logged to MLflow."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from experiments.climb.validation import load_rungs
from experiments.core.errors import ConfigError
from experiments.core.names import Tag
from experiments.core.recipe import Candidate, Env
from experiments.core.reports import BenchmarkReport
from experiments.core.settings import check_settings
from experiments.measure.load import check_load
from experiments.measure.load_ladder import run_ladder
from experiments.record import benchmark_log, packaged, registry, tracking
from experiments.serving import build_engine, engine_class
from experiments.serving.backends.served import ServedEngine
from experiments.serving.http_client import EndpointServer, check_url
from experiments.serving.http_server import bind, create_app, exposure_warning, run_forever, url_of
from experiments.serving.servers import serve
from experiments.targets.kinds import kind_of
from experiments.targets.kinds.causal_lm import causal_workload
from experiments.targets.resolve import built_model_dir, kind_unbuilt, resolve, texts_unbuilt
from experiments.targets.models.hf_folder import context_length
from experiments.targets.workload import LADDER
from optimizers.placement import placed

# Sampled in this process, which for an endpoint run is the load generator, not the server.
CLIENT_SIDE_METRICS = ("cpu_percent", "rss_mb_max")


# --- serve ------------------------------------------------------------------------------------------------
def candidate(cfg: DictConfig, rung_names: list[str], progress) -> Candidate:
    """The ladder's baseline, then each named rung of the configured ladder in the order given."""
    rungs = dict(load_rungs(cfg))
    unknown = [n for n in rung_names if n not in rungs]
    if unknown:
        raise ConfigError(f"--rungs names {', '.join(unknown)}, not in the configured ladder",
                          f"use some of: {', '.join(rungs)} (or pick another ladder=...)")
    (base_name, base), *_ = rungs.items()
    target, _, _ = resolve(cfg.target, Path(cfg.cache_dir), Path(cfg.data_dir), progress)
    _completions_only(target.name, target.kind)
    env = Env.detect()
    try:
        cand = base.apply(placed(target, cfg.target.get("device", "auto"), env))
    except ValueError as exc:
        raise ConfigError(str(exc), "set target.device to auto, cpu or a CUDA device this machine has") from None
    for name in rung_names:
        if name == base_name:
            continue
        if reason := rungs[name].check(env, cand):
            raise ConfigError(f"rung {name!r} does not apply to {' + '.join(cand.rungs)}: {reason}",
                              "drop it from --rungs, or name the rungs it builds on before it "
                              "(e.g. --rungs onnxruntime,dynamic_batching)")
        cand = rungs[name].apply(cand)
    return cand


def serve_candidate(cfg: DictConfig, rung_names: list[str], host: str, port: int, console,
                    champion: str | None = None) -> int:
    """Build the candidate's engine (the registry's champion of model `champion`; "" the default model) and serve
    it until Ctrl-C; a serving engine's champion runs in its own server. The exit status: 1 if that server died."""
    if champion is not None:
        name = champion or registry.default_model_name(cfg.tracking)
        package, version = packaged.champion_package(cfg.tracking, name)
        cand = packaged.candidate_of(package, Path(cfg.cache_dir))
        console.note(f"{name} version {version} ({registry.CHAMPION}): {' + '.join(cand.rungs)}")
    else:
        cand = candidate(cfg, rung_names, console.note)
    if issubclass(engine_class(cand), ServedEngine):
        return _serve_engine_itself(cand, cfg, host, port, console)
    _serve_in_process(cand, cfg, host, port, console)
    return 0


def _serve_engine_itself(cand: Candidate, cfg: DictConfig, host: str, port: int, console) -> int:
    """The serving engine's own server on host:port, as the sweep measured it, until Ctrl-C or until it dies."""
    bind(host, port).close()           # a port in use fails now, not after a minute of the engine's start-up
    with console.stage(f"starting {cand.recipe.engine}'s own server"):
        engine = engine_class(cand)(cand, int(cfg.threads), Path(cfg.cache_dir) / "artefacts", host=host,
                                    port=port or None)
    try:
        console.console.print(f"serving [bold]{cand.target.name}[/bold] ({' + '.join(cand.rungs)}) with "
                              f"{engine.name}'s own server on http://{host}:{engine.process.port}/v1 (its metrics "
                              f"at /metrics) — Ctrl-C stops\n  {' '.join(engine.process.command)}\n  log: "
                              f"{engine.process.log_path}")
        if warning := exposure_warning(host):
            console.console.print(f"[bold yellow]warning:[/bold yellow] {warning}")
        while (ended := engine.process.died()) is None:
            time.sleep(0.5)
        console.console.print(f"[bold red]error:[/bold red] {ended.describe()}")
        return 1
    finally:
        engine.close()


def _serve_in_process(cand: Candidate, cfg: DictConfig, host: str, port: int, console) -> None:
    from transformers import AutoTokenizer  # heavy

    sock = bind(host, port)            # a port in use fails now, not after the engine build
    engine = server = None
    try:
        with console.stage("building the candidate"):
            engine = build_engine(cand, int(cfg.threads), Path(cfg.cache_dir) / "artefacts")
            server = serve(engine)
            tokenizer = AutoTokenizer.from_pretrained(cand.target.model_dir)
        recipe = cand.recipe
        console.console.print(f"serving [bold]{cand.target.name}[/bold] ({' + '.join(cand.rungs)}: {recipe.engine}, "
                              f"{recipe.precision}, batching {recipe.batching}) on {url_of(sock)}/v1 — Ctrl-C stops")
        if warning := exposure_warning(host):
            console.console.print(f"[bold yellow]warning:[/bold yellow] {warning}")
        run_forever(create_app(server, tokenizer, cand.target.name), sock)
    finally:
        if server is not None:
            server.close()
        if engine is not None:
            engine.close()
        sock.close()


# --- bench ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EndpointBench:
    report: BenchmarkReport
    model: str
    run_id: str


def endpoint_tokenizer(cfg_target, cache_dir: Path, given: Path | None) -> tuple[Path, str]:
    """(the folder whose tokenizer makes the prompts, where it came from). Nothing is built: benchmarking
    someone's server must not train or convert a model first."""
    if given is not None:
        given = Path(given).expanduser()
        if not any((given / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            raise ConfigError(f"--tokenizer {given} holds no tokenizer (tokenizer.json or tokenizer_config.json)",
                              "pass the folder of the model the endpoint serves (or one with its tokenizer files)")
        return given, "--tokenizer"
    if (built := built_model_dir(cfg_target, cache_dir)) is not None:
        return built, f"target {cfg_target.name}'s model folder"
    raise ConfigError(f"bench --endpoint needs the served model's tokenizer, and target {cfg_target.name}'s model is "
                      f"not built here ({cfg_target.source}); it is not built for a benchmark of another server",
                      "pass --tokenizer DIR (the folder of the model the endpoint serves), or "
                      "target=folder target.source=DIR")


def _first_requests(workload, cfg_benchmark) -> list:
    """The requests each level will send first (its warm-up's, then twice its minimum), built before the load
    runs; any further one is built when it is sent."""
    levels = len(cfg_benchmark.rates if cfg_benchmark.get("mode", "closed") == "open" else cfg_benchmark.concurrency)
    return [run[i] for block in range(LADDER, LADDER + levels)
            for run, count in ((workload.requests(block, warmup=True), int(cfg_benchmark.warmup_requests)),
                               (workload.requests(block), 2 * int(cfg_benchmark.min_requests)))
            for i in range(count)]


def _context_of(folder: Path) -> int | None:
    """The served model's context window where the tokenizer's folder has its config.json (prompts are checked
    against it), else None."""
    config = folder / "config.json"
    return context_length(json.loads(config.read_text())) if config.is_file() else None


def _completions_only(name: str, kind: str) -> None:
    if not kind_of(kind).decodes:
        raise ConfigError(f"target {name!r} is an encoder ({kind}); the HTTP transport speaks "
                          "/v1/completions only", "benchmark an encoder in process: roi-ladder sweep target=...")


def bench_endpoint(cfg: DictConfig, url: str, model: str | None, prompt_format: str, console,
                   tokenizer_dir: Path | None = None) -> EndpointBench:
    """The target's workload against someone's server; no model is built (the tokenizer makes the prompts)."""
    from transformers import AutoTokenizer  # heavy

    check_settings(cfg, "benchmark.", "target.workload.")
    check_load(cfg.benchmark)
    check_url(url)
    _completions_only(str(cfg.target.name), kind_unbuilt(cfg.target))
    folder, which = endpoint_tokenizer(cfg.target, Path(cfg.cache_dir), tokenizer_dir)
    tracking.probe(cfg.tracking)        # nothing recorded until the endpoint has answered
    with console.stage("target: loading the workload"):
        console.note(f"tokenizer: {folder} ({which})")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        wl = cfg.target.workload
        workload = causal_workload(wl, tokenizer, texts_unbuilt(cfg.target), _context_of(folder),
                                   max(8, cfg.benchmark.warmup_requests), cfg.seed)
    server = EndpointServer(url, model, prompt_format, tokenizer, timeout_s=float(cfg.benchmark.request_timeout_s))
    try:
        experiment_id = tracking.connect(cfg.tracking)
        server.prepare(_first_requests(workload, cfg.benchmark))
        with console.stage(f"load ladder against {server.url} ({server.model})") as st:
            report = run_ladder(server, workload, cfg.benchmark, cfg.gate.confidence,
                                on_level=lambda c: st.update(f"{server.url}: load at {c}"))
    finally:
        server.close()
    tags = {Tag.KIND: "endpoint-bench", Tag.ENDPOINT: server.url, Tag.MODEL: server.model,
            Tag.TARGET: str(cfg.target.name), Tag.TOKENIZER: f"{folder} ({which})", Tag.PROMPT_FORMAT: prompt_format, "git_commit": tracking.git_commit(),
            Tag.QUEUE_MODEL_SPLIT: "not observable behind an endpoint"}
    with tracking.run("endpoint-bench", experiment_id, tags=tags) as run:
        tracking.log_params(tracking.flatten({"benchmark": OmegaConf.to_container(cfg.benchmark, resolve=True),
                                              "workload": OmegaConf.to_container(wl, resolve=True),
                                              "endpoint": server.url, "model": server.model}))
        tracking.log_series({(f"client_{k}" if k in CLIENT_SIDE_METRICS else k): v
                             for k, v in benchmark_log.metric_series(report).items()})
        tracking.log_text(benchmark_log.samples_csv(report), "benchmark/samples.csv")
        tracking.set_tags({f"validity.{k}": str(v) for k, v in report.validity().items()})
    return EndpointBench(report, server.model, run.info.run_id)
