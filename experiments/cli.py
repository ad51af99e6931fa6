"""`roi-ladder`: sweep (a Hydra app), ui."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
USAGE = """usage: roi-ladder COMMAND [hydra overrides]
  sweep   climb the ladder (e.g. roi-ladder sweep profile=quick; --multirun target=a,b)
  ui      start the MLflow UI on 127.0.0.1 and print this sweep's URL
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
    elif command == "ui":
        from experiments.ui import serve_ui
        sys.exit(serve_ui(_compose(rest)))
    else:
        print(f"roi-ladder: unknown command {command!r}\n{USAGE}", file=sys.stderr)
        sys.exit(2)


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def _sweep_app() -> None:
    import hydra

    @hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
    def sweep(cfg) -> None:
        from experiments.console import SweepConsole
        from experiments.errors import ConfigError
        from experiments.ladder import run_sweep

        _quiet_libraries()
        ui = SweepConsole()
        try:
            result = run_sweep(cfg, ui)
        except ConfigError as exc:
            ui.console.print(f"[bold red]error:[/bold red] {exc}")
            sys.exit(2)
        ui.summary(result, int(max(cfg.benchmark.concurrency)), str(cfg.tracking.uri))

    sweep()


def _quiet_libraries() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name in ("lm_eval", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)


if __name__ == "__main__":
    main()
