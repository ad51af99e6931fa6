"""Promotion and rollback through the MLflow model registry.

`promote` packages an accepted rung as a pyfunc model (the recipe + the sweep's config, enough to rebuild the
candidate), registers it, moves the alias `champion` to it and tags the new version with the one it replaced
(`rollback_to`). `rollback` moves `champion` back along that chain and records who, when and why.
"""
from __future__ import annotations

import getpass
import hashlib
import json
import tempfile
import warnings
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.tracking import MlflowClient
from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
from mlflow.types.schema import Array
from omegaconf import OmegaConf

from experiments.core.cache import locked
from experiments.core.errors import ConfigError
from experiments.core.names import Tag
from experiments.core.recipe import Recipe
from experiments.judge.embedding_eval import tokenized
from experiments.record import packaged, soak_decided, tracking
from experiments.serving import build_engine
from experiments.targets import kinds

CHAMPION = "champion"
PACKAGE_NAME = "candidate"
MAX_TAG_CHARS = 5000
MISSING = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")   # what MLflow answers for an unknown id
SIGNATURE = ModelSignature(inputs=Schema([ColSpec("string")]), outputs=Schema([ColSpec("string")]),
                           params=ParamSchema([ParamSpec("max_new_tokens", "long", 32)]))
EMBEDDING_SIGNATURE = ModelSignature(inputs=Schema([ColSpec("string")]),
                                     outputs=Schema([ColSpec(Array(DataType.float))]))


@dataclass(frozen=True)
class PromotionResult:
    model_name: str
    version: str
    run_id: str
    rollback_to: str          # "" when this is the first champion


@dataclass(frozen=True)
class RollbackResult:
    model_name: str
    from_version: str
    to_version: str


# --- promote ----------------------------------------------------------------------------------------------
def promote(tracking_cfg, run_id: str | None = None, model_name: str | None = None) -> PromotionResult:
    run, client = rung_run(tracking_cfg, run_id), MlflowClient()
    verdict = run.data.tags.get(Tag.VERDICT)
    if verdict != "accepted":
        raise ConfigError(f"run {run.info.run_id} (rung {run.data.tags.get(Tag.RUNG)!r}) was {verdict}, "
                          f"not accepted: {run.data.tags.get(Tag.REASON, '')[:200]}",
                          "promote a run whose roi.verdict is accepted (e.g. the sweep's roi.champion_run)")
    soak_decided.require(run)
    sweep = client.get_run(run.data.tags["mlflow.parentRunId"])
    kind = sweep.data.params.get("target.kind", kinds.DEFAULT_KIND)
    if kinds.kind_of(kind).packaged_as is None:
        packaged = [kinds.kind_of(k) for k in kinds.names() if kinds.kind_of(k).packaged_as]
        raise ConfigError(f"run {run.info.run_id} is of a {kind} target; promotion packages "
                          f"{' and '.join(f'{k.noun}s ({k.packaged_as})' for k in packaged)} only",
                          f"promote a {' or '.join(k.noun for k in packaged)} sweep's run; packaging "
                          f"{kinds.kind_of(kind).noun}s is not built yet")
    name = model_name or _default_name(sweep)
    model_uri = _log_package(run, sweep)
    with registry_lock(str(tracking_cfg.uri)):
        # Read the old champion, register and move the alias as one step, or two promotions racing could
        # both point rollback_to at the same version and lose one from the chain.
        previous = _champion_version(client, name) or ""
        version = str(mlflow.register_model(model_uri, name, tags=_version_tags(run, previous, kind)).version)
        client.set_registered_model_alias(name, CHAMPION, version)
    client.set_tag(run.info.run_id, Tag.PROMOTED_VERSION, f"{name}/{version}")
    return PromotionResult(name, version, run.info.run_id, previous)


def rung_run(tracking_cfg, run_id: str | None):
    """A finished rung's run (default: the latest sweep's champion)."""
    client = _connect(tracking_cfg)
    return _rung_run(client, run_id) if run_id else _latest_champion_run(client, tracking_cfg)


def sweep_config(run):
    """The resolved config of the sweep a rung's run belongs to."""
    return OmegaConf.create(_sweep_config(MlflowClient().get_run(run.data.tags["mlflow.parentRunId"])))


def _rung_run(client: MlflowClient, run_id: str):
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code not in MISSING:
            raise
        raise ConfigError(f"run {run_id!r} does not exist in {mlflow.get_tracking_uri()}",
                          "pass the run id of a rung (a child run of a sweep), or omit --run for the "
                          "latest sweep's champion") from None
    if run.data.tags.get(Tag.KIND) != "rung" or "mlflow.parentRunId" not in run.data.tags:
        raise ConfigError(f"run {run_id} is not a rung run (roi.kind={run.data.tags.get(Tag.KIND)!r})",
                          "pass the run id of a rung, i.e. a child run of a sweep")
    if run.info.status != "FINISHED":
        # Logging the package reopens the run, and closing it again would mark a live sweep's run finished.
        raise ConfigError(f"run {run_id} is {run.info.status}", "promote it once its sweep has finished")
    return run


def _latest_champion_run(client: MlflowClient, tracking_cfg):
    sweep = _latest_sweep(client, tracking_cfg)
    champion = sweep.data.tags.get(Tag.CHAMPION_RUN, "")
    if not champion:
        raise ConfigError(f"the latest sweep ({sweep.info.run_name}) has no champion: no rung was accepted",
                          "run a sweep whose baseline completes, or pass --run with an accepted rung")
    return _rung_run(client, champion)


def _latest_sweep(client: MlflowClient, tracking_cfg):
    exp = client.get_experiment_by_name(str(tracking_cfg.experiment))
    run = tracking.latest_sweep(client, [exp.experiment_id] if exp else [])
    if run is None:
        raise ConfigError(f"no finished sweep in experiment {tracking_cfg.experiment!r} at {tracking_cfg.uri}",
                          "run `make sweep` first (or pass the same target/tracking overrides as the sweep)")
    return run


def _default_name(sweep) -> str:
    return f"roi-ladder-{sweep.data.params.get('target.name') or sweep.data.tags[Tag.TARGET]}"


def _version_tags(run, rollback_to: str, kind: str) -> dict[str, str]:
    tags = {"rollback_to": rollback_to, "source_run": run.info.run_id, "rung": run.data.tags.get(Tag.RUNG, ""),
            "verdict": run.data.tags.get(Tag.REASON, "")[:MAX_TAG_CHARS],
            "promoted_at": _now(), "promoted_by": getpass.getuser(), **packaged.server_tags(run.data.tags)}
    return tags | {k: f"{v:.6g}" for k, v in key_metrics(run.data.metrics, kind).items()}


def key_metrics(metrics: dict[str, float], kind: str) -> dict[str, float]:
    """The target kind's latency and throughput figures and the accuracy worth seeing beside a version (latest
    values of the run)."""
    accuracy = {k: v for k, v in metrics.items() if k.startswith("accuracy/") and not k.endswith("_stderr")}
    return {k: metrics[k] for k in kinds.kind_of(kind).key_metrics if k in metrics} | accuracy


# --- the package: recipe + config, rebuilt into an engine at load time ---------------------------------------
def _log_package(run, sweep) -> str:
    """Log the pyfunc model into the rung's run; returns its LoggedModel URI (models:/m-...).

    MLflow 3 keeps logged models outside the run: registering `runs:/<id>/<path>` would make a version that
    cannot be loaded, so the LoggedModel URI is what gets registered."""
    config_yaml = _sweep_config(sweep)
    config = OmegaConf.create(config_yaml)
    with tempfile.TemporaryDirectory() as tmp:
        recipe_file, config_file = Path(tmp) / "recipe.json", Path(tmp) / "resolved.yaml"
        recipe_file.write_text(json.dumps(package_recipe(run, config), indent=2))
        config_file.write_text(config_yaml)
        with mlflow.start_run(run_id=run.info.run_id), warnings.catch_warnings():
            # No input example on purpose: MLflow would load the model (build the engine) to check it.
            warnings.filterwarnings("ignore", message=".*input example was not provided")
            info = mlflow.pyfunc.log_model(
                name=PACKAGE_NAME, python_model=CandidateModel(),
                signature=SIGNATURE if kinds.kind_of(str(config.target.kind)).decodes else EMBEDDING_SIGNATURE,
                artifacts={"recipe": str(recipe_file), "config": str(config_file)},
                # Explicit, so MLflow does not load the model in a subprocess to infer them.
                pip_requirements=_requirements(),
                # no cache folder (this machine's): where a version loads, packaged.load_cache_dir() finds one, or
                # load_model(model_config=) names it (MLflow overrides only the keys logged, hence None)
                model_config={"cache_dir": None, "threads": int(config.threads)})
    return info.model_uri


def _sweep_config(sweep) -> str:
    try:
        return mlflow.artifacts.load_text(f"runs:/{sweep.info.run_id}/config/resolved.yaml")
    except (MlflowException, OSError):
        raise ConfigError(f"sweep run {sweep.info.run_id} has no artefact config/resolved.yaml",
                          "promote a rung of a sweep logged by `roi-ladder sweep`") from None


def package_recipe(run, config) -> dict:
    params = run.data.params
    rungs = [params[f"recipe.rungs.{i}"] for i in range(len(params)) if f"recipe.rungs.{i}" in params]
    target = config.target
    build = OmegaConf.to_container(target.build, resolve=True) if "build" in target else None   # tiny-llm's
    return {"target": {"name": str(target.name), "kind": str(target.kind), "source": str(target.source),
                       "build": build, "max_tokens": target.workload.get("max_tokens")},
            "recipe": recipe_from_params(params, run.info.run_id), "rungs": rungs}


def recipe_from_params(params: dict[str, str], run_id: str = "") -> dict:
    """The run's `recipe.*` params, typed like Recipe's fields. A field the run lacks predates it, so the
    run ran with its default: it is left out and Recipe fills it in."""
    if "recipe.engine" not in params:
        raise ConfigError(f"run {run_id} has no recipe.* params", "promote a rung run logged by `roi-ladder sweep`")
    defaults = Recipe()
    return {f.name: _typed(params[f"recipe.{f.name}"], getattr(defaults, f.name))
            for f in fields(Recipe) if f"recipe.{f.name}" in params}


def _typed(text: str, like):
    if isinstance(like, bool):
        return text == "True"
    return type(like)(text)


def _requirements() -> list[str]:
    pins = []
    for dist in ("roi-ladder", "mlflow", "torch", "transformers", "onnxruntime-genai", "onnxruntime",
                 "hydra-core", "omegaconf"):
        try:
            pins.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return pins


class CandidateModel(PythonModel):
    """A promoted candidate: rebuilds its engine from the recipe; predict = greedy continuations."""

    def load_context(self, context) -> None:
        package = json.loads(Path(context.artifacts["recipe"]).read_text())
        settings = context.model_config or {}
        # a version promoted before records its promoting machine's folder; load_model(model_config=) may set one
        cache_dir = Path(settings["cache_dir"]) if settings.get("cache_dir") else packaged.load_cache_dir()
        candidate = packaged.candidate_of(package, cache_dir)
        self.engine = build_engine(candidate, int(settings.get("threads", 1)), cache_dir / "artefacts")
        if not self.engine.decodes:   # an encoder: its texts are tokenized as the sweep's workload was
            self.tokenizer = kinds.load_tokenizer(candidate.target.model_dir)
            self.max_tokens = int(package["target"].get("max_tokens") or 128)

    # MLflow enforces SIGNATURE first, so a list of prompts arrives as a one-column DataFrame.
    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> list:
        """Greedy continuations (a causal LM), or L2-normalised embeddings as lists of floats (an encoder)."""
        if not self.engine.decodes:
            vectors, _ = self.engine.embed(tokenized(self.tokenizer, _prompts(model_input), self.max_tokens))
            return [row.tolist() for row in vectors]
        max_new_tokens = int((params or {}).get("max_new_tokens", 32))
        return [self._continue(prompt, max_new_tokens) for prompt in _prompts(model_input)]

    def _continue(self, prompt: str, max_new_tokens: int) -> str:
        tokenizer = self.engine.tokenizer
        # As the benchmark feeds prompts: raw text, no BOS.
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        out = []
        for token, _compute_s in self.engine.generate(ids, max_new_tokens):
            if token == tokenizer.eos_token_id:
                break
            out.append(token)
        return tokenizer.decode(out, skip_special_tokens=True)


def _prompts(model_input) -> list[str]:
    if isinstance(model_input, pd.DataFrame):
        column = "prompt" if "prompt" in model_input.columns else model_input.columns[0]
        return [str(p) for p in model_input[column]]
    return [str(p) for p in model_input]


# --- rollback and status ------------------------------------------------------------------------------------
def rollback(tracking_cfg, model_name: str | None = None, to_version: str | None = None,
             reason: str = "") -> RollbackResult:
    client = _connect(tracking_cfg)
    name = model_name or _default_name(_latest_sweep(client, tracking_cfg))
    with registry_lock(str(tracking_cfg.uri)):
        current = _champion_version(client, name)
        if current is None:
            raise ConfigError(f"model {name!r} has no version with alias {CHAMPION!r}",
                              "promote a run first: roi-ladder promote")
        target = str(to_version or "") or client.get_model_version(name, current).tags.get("rollback_to", "")
        if not target:
            raise ConfigError(f"version {current} of {name!r} is the first champion: there is no earlier "
                              f"version to roll back to", "pass --to VERSION to choose one explicitly")
        _require_version(client, name, target)
        if target == current:
            raise ConfigError(f"version {target} of {name!r} is already the champion", "pick another version")
        client.set_model_version_tag(name, current, "rolled_back_at", _now())
        client.set_model_version_tag(name, current, "rolled_back_by", getpass.getuser())
        client.set_model_version_tag(name, current, "rolled_back_reason", (reason or "none given")[:MAX_TAG_CHARS])
        client.set_registered_model_alias(name, CHAMPION, target)
        client.set_model_version_tag(name, target, "restored_at", _now())
        client.set_model_version_tag(name, target, "restored_from", current)
    return RollbackResult(name, current, target)


def status(tracking_cfg, model_name: str | None = None) -> list[dict]:
    """The champion chain: the champion first, then each `rollback_to` in turn."""
    client = _connect(tracking_cfg)
    name = model_name or _default_name(_latest_sweep(client, tracking_cfg))
    versions = {str(mv.version): mv for mv in client.search_model_versions(f"name = '{name}'")}
    if not versions:
        raise ConfigError(f"no model named {name!r} is registered at {tracking_cfg.uri}",
                          "promote a run first: roi-ladder promote")
    champion = _champion_version(client, name)
    chain, seen, version = [], set(), champion
    while version and version in versions and version not in seen:
        seen.add(version)
        chain.append(_describe(versions[version], version == champion))
        version = versions[version].tags.get("rollback_to", "")
    return chain


def _describe(mv, is_champion: bool) -> dict:
    tags = mv.tags
    known = {m for name in kinds.names() for m in kinds.kind_of(name).key_metrics}
    metrics = {k: float(v) for k, v in tags.items() if k in known or k.startswith("accuracy/")}
    return {"version": str(mv.version), "champion": is_champion, "source_run": tags.get("source_run", mv.run_id),
            "rung": tags.get("rung", ""), "verdict": tags.get("verdict", "")[:160], "metrics": metrics,
            "created": _iso(mv.creation_timestamp), "rollback_to": tags.get("rollback_to", ""),
            "rolled_back_at": tags.get("rolled_back_at", "")}


def format_chain(name: str, chain: list[dict]) -> str:
    if not chain:
        return f"{name}: no version holds the alias {CHAMPION!r}; promote one with roi-ladder promote"
    lines = [f"{name}: champion first, then the versions `rollback` would restore"]
    for e in chain:
        figures = "  ".join(f"{k.rsplit('/', 1)[-1]}={v:.4g}" for k, v in e["metrics"].items())
        mark = "champion" if e["champion"] else "        "
        lines.append(f"{mark} v{e['version']:<4} {e['rung']:<14} run {e['source_run']}  {e['created']}  {figures}")
        lines.append(f"{'':14}{e['verdict']}" + (f"  [rolled back {e['rolled_back_at']}]" if e["rolled_back_at"] else ""))
    return "\n".join(lines)


def default_model_name(tracking_cfg) -> str:
    """`roi-ladder-<target>` of the latest sweep in the configured experiment."""
    return _default_name(_latest_sweep(_connect(tracking_cfg), tracking_cfg))


# --- registry helpers -----------------------------------------------------------------------------------------
def _connect(tracking_cfg) -> MlflowClient:
    tracking.connect(tracking_cfg)
    return MlflowClient()


def _champion_version(client: MlflowClient, name: str) -> str | None:
    try:
        version = client.get_registered_model(name).aliases.get(CHAMPION)
        return None if version is None else str(version)
    except MlflowException as exc:
        if exc.error_code in MISSING:
            return None
        raise


def _require_version(client: MlflowClient, name: str, version: str) -> None:
    try:
        client.get_model_version(name, version)
    except MlflowException as exc:
        if exc.error_code not in MISSING:
            raise
        raise ConfigError(f"model {name!r} has no version {version!r}",
                          "see the versions with roi-ladder status, or in the MLflow UI") from None


def registry_lock(uri: str):
    """Exclusive across processes on this machine (a shared server needs its own coordination)."""
    return locked(lock_path(uri))


def lock_path(uri: str) -> Path:
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).parent / "registry.lock"
    folder = Path(tempfile.gettempdir()) / f"roi-ladder-{hashlib.sha256(uri.encode()).hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "registry.lock"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _iso(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds") if ms else ""


# --- reading a rung's capacity plan (`roi-ladder capacity`) -------------------------------------------------
def capacity_plan_text(tracking_cfg, run_id: str | None = None) -> str:
    client = _connect(tracking_cfg)
    run = _rung_run(client, run_id) if run_id else _latest_champion_run(client, tracking_cfg)
    try:
        plan = mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/capacity/plan.md")
    except MlflowException:
        reason = run.data.tags.get(Tag.CAPACITY, "this rung was not measured (skipped or failed)")
        raise ConfigError(f"run {run.info.run_id} has no capacity plan: {reason}",
                          "pick a measured rung, or lower capacity.sla_tier's demands") from None
    return f"capacity plan of rung {run.data.tags.get(Tag.RUNG)} (run {run.info.run_id})\n{plan}"
