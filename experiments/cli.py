"""`roi-ladder`: sweep (a Hydra app), ui, the registry commands, serve and bench --endpoint."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path

from experiments.climb.overrides import CONF_DIR, check_sweep_args, compose, explain
from experiments.core.errors import ConfigError, SweepInterrupted
from experiments.core.interrupts import Terminated, exit_on_sigterm
from experiments.core.secrets import guard_console, scrub_text

# Each command imports the modules it runs when it is chosen (start-up): `roi-ladder status` or a refused
# override answers in a second, without loading torch, transformers and MLflow.

USAGE = """usage: roi-ladder COMMAND [hydra overrides]
  sweep   climb the ladder (e.g. roi-ladder sweep profile=quick; --multirun target=a,b)
  ui      start the MLflow UI on 127.0.0.1 and print this sweep's URL
  promote   [--run RUN] [--name NAME]  register an accepted rung (default: the latest sweep's champion)
            as the registered model's new version with alias `champion`
  soak      [--run RUN]  soak an accepted rung for conf/soak's length (4 min warm-up, 30 min), where its sweep's
            soak was too short to tell a leak (promote asks for it then)
  rollback  [--to VERSION] [--reason TEXT] [--name NAME]  move `champion` back (default: to its rollback_to)
  status    [--name NAME]  the champion and the versions a rollback would restore, newest first
  capacity  [--run RUN]  the capacity and cost plan of a rung run (default: the latest sweep's champion)
  serve     [--rungs onnxruntime,dynamic_batching] [--host 127.0.0.1] [--port 8000]  the baseline plus those
            rungs as an OpenAI-compatible endpoint (/v1/completions, /v1/models, /health) until Ctrl-C
  bench     --endpoint URL [--model NAME] [--tokenizer DIR] [--prompt-format ids|text]  the target's workload
            over the benchmark.* load ladder against an OpenAI-compatible endpoint, prompts made by the served
            model's tokenizer (--tokenizer, or the target's folder; nothing is built); logged as `endpoint-bench`
"""


def main() -> None:
    exit_on_sigterm()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")        # lm-eval's per-request bars would bury the ladder
    guard_console()
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    command, rest = sys.argv[1], sys.argv[2:]
    sys.argv = [f"roi-ladder {command}"] + rest
    sys.exit(guarded(lambda: _command(command, rest)))


def _command(command: str, rest: list[str]) -> int:
    if command == "sweep":
        return _sweep_app()
    if command in REGISTRY_COMMANDS:
        return _registry_command(command, rest)
    if command in HTTP_COMMANDS:
        return _http_command(command, rest)
    if command == "ui":
        from experiments.record.console import quiet_libraries  # start-up
        from experiments.record.ui import serve_ui  # start-up

        quiet_libraries()
        return serve_ui(_compose(rest))
    print(f"roi-ladder: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


def guarded(work) -> int:
    """The one error boundary: whatever `work` raises is one scrubbed `error: ...` line and an exit status,
    never a traceback. Bad input (a ConfigError, a Hydra override, a folder that cannot be made) exits 2; an
    unexpected failure exits 1 with its traceback kept in a file."""
    from hydra.errors import HydraException  # start-up

    try:
        return work() or 0
    except ConfigError as exc:
        return refuse(exc)
    except HydraException as exc:
        return refuse(explain(exc))
    except OSError as exc:
        if exc.filename is None:
            return crashed(exc)
        # Hydra making its output folder (hydra.run.dir, under data_dir) before any job runs
        return refuse(ConfigError(f"could not create or write {exc.filename} ({exc.strerror or exc})",
                                  "set data_dir=... or ROI_LADDER_HOME to a writable folder"))
    except KeyboardInterrupt as exc:
        return 143 if isinstance(exc, Terminated) else 130
    except Exception as exc:  # noqa: BLE001 - the boundary: reported in one line, traceback kept
        return crashed(exc)


def refuse(exc) -> int:
    print(f"error: {one_line(str(exc))}", file=sys.stderr, flush=True)
    return 2


def crashed(exc: BaseException) -> int:
    """An error that is not bad input: one line, and the scrubbed traceback in a file to report."""
    with tempfile.NamedTemporaryFile("w", prefix="roi-ladder-traceback-", suffix=".txt", delete=False) as f:
        f.write(scrub_text("".join(traceback.format_exception(exc))))
    print(f"error: {type(exc).__name__}: {one_line(str(exc))[:500]}. this is not a known input mistake; the "
          f"traceback is in {f.name}, report it with that file.", file=sys.stderr, flush=True)
    return 1


def one_line(text: str) -> str:
    return " ".join(text.split())


REGISTRY_COMMANDS = ("promote", "rollback", "status", "capacity")


def _registry_command(command: str, argv: list[str]) -> int:
    """promote / rollback / status: flags via argparse, everything else is a Hydra override."""
    from experiments.record import registry  # start-up
    from experiments.record.console import quiet_libraries  # start-up

    parser = argparse.ArgumentParser(prog=f"roi-ladder {command}", allow_abbrev=False,
                                     epilog="other arguments are Hydra overrides, e.g. data_dir=... target=...")
    if command != "capacity":
        parser.add_argument("--name", help="registered model name (default: roi-ladder-<target of the latest sweep>)")
    if command == "promote":
        parser.add_argument("--run", help="run id of an accepted rung (default: the latest sweep's champion)")
    if command == "capacity":
        parser.add_argument("--run", help="a rung run id (default: the latest sweep's champion)")
    if command == "rollback":
        parser.add_argument("--to", help="version to restore (default: the champion's rollback_to)")
        parser.add_argument("--reason", default="", help="why; recorded on the version rolled back from")
    args, overrides = parser.parse_known_args(argv)
    quiet_libraries()
    tracking_cfg = on_the_latest_sweep(_compose(overrides), overrides).tracking
    if command == "promote":
        r = registry.promote(tracking_cfg, args.run, args.name)
        print(f"promoted run {r.run_id}: {r.model_name} version {r.version} is the champion "
              f"(rollback_to: {r.rollback_to or 'none, the first champion'})")
    elif command == "capacity":
        print(registry.capacity_plan_text(tracking_cfg, args.run))
    elif command == "rollback":
        r = registry.rollback(tracking_cfg, args.name, args.to, args.reason)
        print(f"{r.model_name}: champion moved from version {r.from_version} to version {r.to_version}")
    else:
        name = args.name or registry.default_model_name(tracking_cfg)
        print(registry.format_chain(name, registry.status(tracking_cfg, name)))
    return 0


HTTP_COMMANDS = ("serve", "bench", "soak")


def _http_command(command: str, argv: list[str]) -> int:
    """serve / bench --endpoint / soak: flags via argparse, everything else is a Hydra override."""
    from experiments.climb import endpoint  # start-up
    from experiments.record.console import SweepConsole, level_table, quiet_libraries  # start-up
    from experiments.serving.http_client import PROMPT_FORMATS  # start-up
    from experiments.serving.http_server import DEFAULT_HOST  # start-up

    parser = argparse.ArgumentParser(prog=f"roi-ladder {command}", allow_abbrev=False,
                                     epilog="other arguments are Hydra overrides, e.g. benchmark.concurrency=[1,4]")
    if command == "soak":
        parser.add_argument("--run", help="a rung run id (default: the latest sweep's champion)")
    elif command == "serve":
        parser.add_argument("--rungs", default="", help="rungs of the configured ladder to apply on top of the "
                                                        "baseline, comma-separated, in order (default: none)")
        parser.add_argument("--host", default=DEFAULT_HOST,
                            help=f"address to listen on (default {DEFAULT_HOST}; another one exposes the model)")
        parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
        parser.add_argument("--champion", nargs="?", const="", metavar="NAME",
                            help="serve the registry's champion of model NAME (default: roi-ladder-<target>) as "
                                 "promoted; a serving engine's champion runs in that engine's own server")
    elif command == "bench":
        parser.add_argument("--endpoint", required=True, help="base URL, e.g. http://127.0.0.1:8000")
        parser.add_argument("--model", help="model to ask for (default: the first one the endpoint lists)")
        parser.add_argument("--tokenizer", type=Path, help="folder of the served model's tokenizer, which makes the "
                                                           "prompts (default: the target's folder, if on disk)")
        parser.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="ids",
                            help="send token ids (exact prompts; default) or their text (any tokenizer)")
    args, overrides = parser.parse_known_args(argv)
    quiet_libraries()
    ui = SweepConsole()
    try:
        cfg = _compose(overrides)
        if command == "soak" or (command == "serve" and args.champion is not None):
            cfg = on_the_latest_sweep(cfg, overrides)
        if command == "soak":
            from experiments.climb.followup_soak import soak_rung  # start-up

            report = soak_rung(cfg, args.run, ui)
            ui.console.print(f"soak {report.outcome}: {report.criterion().detail}")
            return 0 if report.outcome != "NOT clean" else 1
        if command == "serve":
            if args.champion is not None and args.rungs:
                raise ConfigError("serve takes --rungs or --champion, not both",
                                  "--champion serves the promoted recipe as it is")
            code = 0
            try:
                code = endpoint.serve_candidate(cfg, [r.strip() for r in args.rungs.split(",") if r.strip()],
                                                args.host, args.port, ui, args.champion)
            except KeyboardInterrupt:
                pass
            ui.console.print("stopped.")
            return code
        else:
            result = endpoint.bench_endpoint(cfg, args.endpoint, args.model, args.prompt_format, ui, args.tokenizer)
            ui.console.print(level_table(result.report, f"{args.endpoint} · {result.model}"))
            ui.console.print(f"Logged run endpoint-bench ({result.run_id}) to {cfg.tracking.uri}.")
    except KeyboardInterrupt:
        return 130
    return 0


def _compose(overrides: list[str]):
    return compose(overrides)


def on_the_latest_sweep(cfg, overrides: list[str]):
    """Without target= (or tracking.experiment=), the commands that read a sweep act on the store's latest one,
    whatever its target: `make sweep target=smollm2`, then `make promote`, promotes that sweep's champion."""
    if any(o.lstrip("+~").startswith(("target", "tracking.experiment")) for o in overrides):
        return cfg
    from omegaconf import OmegaConf  # start-up

    from experiments.record import tracking  # start-up

    latest = tracking.latest_sweep_experiment(cfg.tracking)
    if latest and latest != cfg.tracking.experiment:
        print(f"acting on the store's latest sweep, in experiment {latest!r} (target=... chooses another)",
              file=sys.stderr)
        OmegaConf.update(cfg, "tracking.experiment", latest)
    return cfg


def _sweep_app() -> int:
    """Hydra runs the jobs; each job's failure is reported by the boundary inside it, so Hydra never prints
    its own error (whose "Error executing job with overrides: [...]" line would echo a password)."""
    import hydra  # start-up

    check_sweep_args(sys.argv[1:])
    codes: list[int] = []
    this_process = os.getpid()

    @hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
    def sweep(cfg) -> None:
        guard_console()          # again: a launcher (joblib, submitit) may run the job in a process of its own
        scrub_hydra_record()
        code = guarded(lambda: _sweep_job(cfg))
        # Ctrl-C ends every job of a multirun; a job in a launcher's worker tells its failure by its exit status
        if code == 130 or (code and os.getpid() != this_process):
            sys.exit(code)
        codes.append(code)

    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"   # what fails outside a job (its output folder) reaches `guarded`
    try:
        sweep()
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR")
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error
    return max(codes, default=0)


def scrub_hydra_record() -> None:
    """Hydra has just written the job's overrides and config (.hydra/*.yaml, multirun.yaml) as given: a
    password in tracking.uri would stay on disk in plain text."""
    from hydra.core.hydra_config import HydraConfig  # start-up

    hydra_cfg = HydraConfig.get()
    saved = [Path(hydra_cfg.sweep.dir) / "multirun.yaml"]   # a multirun's, written before its first job
    if hydra_cfg.output_subdir is not None:
        saved += (Path(hydra_cfg.runtime.output_dir) / hydra_cfg.output_subdir).glob("*.yaml")
    for path in (p for p in saved if p.is_file()):
        path.write_text(scrub_text(path.read_text()))


def _sweep_job(cfg) -> int:
    from experiments.climb.ladder import run_sweep  # start-up
    from experiments.record.console import SweepConsole, quiet_libraries  # start-up

    quiet_libraries()
    ui = SweepConsole()
    try:
        result = run_sweep(cfg, ui)
    except SweepInterrupted as exc:
        ui.console.print(f"[bold yellow]stopped:[/bold yellow] {exc}")
        return 130
    except KeyboardInterrupt:
        ui.console.print("[bold yellow]stopped at once:[/bold yellow] the rung that was running is marked "
                         "KILLED; run the same command again to resume from it")
        return 130
    ui.summary(result, int(max(cfg.benchmark.concurrency)), str(cfg.tracking.uri))
    if result.champion is None:
        return no_champion(result, str(cfg.tracking.uri))
    return 0


def no_champion(result, tracking_uri: str) -> int:
    """A sweep whose baseline failed has nothing to compare or promote: a failure, its reason last."""
    baseline = result.outcomes[0] if result.outcomes else None
    reason = one_line(baseline.verdict.reason) if baseline else "no rung was climbed"
    print(f"error: the sweep has no champion: the baseline {baseline.verdict.status if baseline else 'did not run'}"
          f" ({reason[:1000].rstrip('.')}). fix that and run the sweep again; its runs stay recorded in {tracking_uri}.",
          file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    main()
