"""`roi-ladder`: sweep (a Hydra app), ui, the registry commands, serve and bench --endpoint."""
from __future__ import annotations

import os
import sys

from experiments.overrides import CONF_DIR

USAGE = """usage: roi-ladder COMMAND [hydra overrides]
  sweep   climb the ladder (e.g. roi-ladder sweep profile=quick; --multirun target=a,b)
  ui      start the MLflow UI on 127.0.0.1 and print this sweep's URL
  promote   [--run RUN] [--name NAME]  register an accepted rung (default: the latest sweep's champion)
            as the registered model's new version with alias `champion`
  rollback  [--to VERSION] [--reason TEXT] [--name NAME]  move `champion` back (default: to its rollback_to)
  status    [--name NAME]  the champion and the versions a rollback would restore, newest first
  capacity  [--run RUN]  the capacity and cost plan of a rung run (default: the latest sweep's champion)
  serve     [--rungs onnxruntime,dynamic_batching] [--host 127.0.0.1] [--port 8000]  the baseline plus those
            rungs as an OpenAI-compatible endpoint (/v1/completions, /v1/models, /health) until Ctrl-C
  bench     --endpoint URL [--model NAME] [--prompt-format ids|text]  the target's workload over the
            benchmark.* load ladder against an OpenAI-compatible endpoint; logged as run `endpoint-bench`
"""


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")        # lm-eval's per-request bars would bury the ladder
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    command, rest = sys.argv[1], sys.argv[2:]
    sys.argv = [f"roi-ladder {command}"] + rest
    if command == "sweep":
        _sweep_app()
    elif command in REGISTRY_COMMANDS:
        sys.exit(_registry_command(command, rest))
    elif command in HTTP_COMMANDS:
        sys.exit(_http_command(command, rest))
    elif command == "ui":
        from experiments.console import quiet_libraries
        from experiments.ui import serve_ui

        from experiments.errors import ConfigError

        quiet_libraries()
        try:
            cfg = _compose(rest)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        sys.exit(serve_ui(cfg))
    else:
        print(f"roi-ladder: unknown command {command!r}\n{USAGE}", file=sys.stderr)
        sys.exit(2)


REGISTRY_COMMANDS = ("promote", "rollback", "status", "capacity")


def _registry_command(command: str, argv: list[str]) -> int:
    """promote / rollback / status: flags via argparse, everything else is a Hydra override."""
    import argparse

    from hydra.errors import HydraException

    from experiments import registry
    from experiments.console import quiet_libraries
    from experiments.errors import ConfigError

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
    try:
        tracking_cfg = _compose(overrides).tracking
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
    except (ConfigError, HydraException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


HTTP_COMMANDS = ("serve", "bench")


def _http_command(command: str, argv: list[str]) -> int:
    """serve / bench --endpoint: flags via argparse, everything else is a Hydra override."""
    import argparse

    from hydra.errors import HydraException

    from experiments import endpoint
    from experiments.console import SweepConsole, level_table, quiet_libraries
    from experiments.errors import ConfigError
    from experiments.serving.http_client import PROMPT_FORMATS
    from experiments.serving.http_server import DEFAULT_HOST

    parser = argparse.ArgumentParser(prog=f"roi-ladder {command}", allow_abbrev=False,
                                     epilog="other arguments are Hydra overrides, e.g. benchmark.concurrency=[1,4]")
    if command == "serve":
        parser.add_argument("--rungs", default="", help="rungs of the configured ladder to apply on top of the "
                                                        "baseline, comma-separated, in order (default: none)")
        parser.add_argument("--host", default=DEFAULT_HOST,
                            help=f"address to listen on (default {DEFAULT_HOST}; another one exposes the model)")
        parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    else:
        parser.add_argument("--endpoint", required=True, help="base URL, e.g. http://127.0.0.1:8000")
        parser.add_argument("--model", help="model to ask for (default: the first one the endpoint lists)")
        parser.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="ids",
                            help="send token ids (exact prompts; default) or their text (any tokenizer)")
    args, overrides = parser.parse_known_args(argv)
    quiet_libraries()
    ui = SweepConsole()
    try:
        cfg = _compose(overrides)
        if command == "serve":
            try:
                endpoint.serve_candidate(cfg, [r.strip() for r in args.rungs.split(",") if r.strip()], args.host,
                                         args.port, ui)
            except KeyboardInterrupt:
                pass
            ui.console.print("stopped.")
        else:
            result = endpoint.bench_endpoint(cfg, args.endpoint, args.model, args.prompt_format, ui)
            ui.console.print(level_table(result.report, f"{args.endpoint} · {result.model}"))
            ui.console.print(f"Logged run endpoint-bench ({result.run_id}) to {cfg.tracking.uri}.")
    except (ConfigError, HydraException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _compose(overrides: list[str]):
    from experiments.overrides import compose

    return compose(overrides)


def _sweep_app() -> None:
    import hydra

    from experiments.errors import ConfigError
    from experiments.overrides import check_sweep_args

    try:
        check_sweep_args(sys.argv[1:])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

    @hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
    def sweep(cfg) -> None:
        from experiments.console import SweepConsole, quiet_libraries
        from experiments.errors import ConfigError, SweepInterrupted
        from experiments.ladder import run_sweep

        quiet_libraries()
        ui = SweepConsole()
        try:
            result = run_sweep(cfg, ui)
        except ConfigError as exc:
            ui.console.print(f"[bold red]error:[/bold red] {exc}")
            sys.exit(2)
        except SweepInterrupted as exc:
            ui.console.print(f"[bold yellow]stopped:[/bold yellow] {exc}")
            sys.exit(130)
        except KeyboardInterrupt:
            ui.console.print("[bold yellow]stopped at once:[/bold yellow] the rung that was running is marked "
                             "KILLED; run the same command again to resume from it")
            sys.exit(130)
        ui.summary(result, int(max(cfg.benchmark.concurrency)), str(cfg.tracking.uri))

    sweep()


if __name__ == "__main__":
    main()
