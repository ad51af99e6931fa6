"""Hydra overrides checked before any work: a bad one is one ConfigError line, not Hydra's multi-line report."""
from __future__ import annotations

import tempfile
from pathlib import Path

from experiments.core.errors import ConfigError

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic"
# Flags hydra.main takes besides overrides; with any other flag (--cfg, --info, ...) Hydra has the last word.
MULTIRUN_FLAGS = ("-m", "--multirun")


def compose(overrides: list[str]):
    """The config these overrides make, or a ConfigError saying which override is wrong."""
    from hydra import compose as hydra_compose, initialize_config_dir  # start-up
    from hydra.errors import HydraException  # start-up

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    except HydraException as exc:
        raise explain(exc) from None


def check_sweep_args(args: list[str]) -> None:
    """Compose each job a `roi-ladder sweep` command line asks for, once per swept value, before Hydra runs
    it: hydra.main would print a composition error over a dozen lines and exit 1."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # start-up
    from hydra.errors import HydraException  # start-up

    if any(a.startswith("-") and a not in MULTIRUN_FLAGS for a in args):
        return
    multirun = any(a in MULTIRUN_FLAGS for a in args)
    overrides = [a for a in args if a not in MULTIRUN_FLAGS]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise explain(exc) from None
    if not multirun:
        check_job(overrides)
        return
    try:
        values = {i: list(o.sweep_string_iterator()) for i, o in enumerate(parsed) if o.is_sweep_override()}
    except HydraException:   # a sweep only its sweeper can enumerate (a glob, an interval): Hydra checks it
        return
    first = [f"{o.get_key_element()}={values[i][0]}" if i in values else overrides[i] for i, o in enumerate(parsed)]
    check_job(first)
    for i, choices in values.items():
        for value in choices[1:]:
            check_job(first[:i] + [f"{parsed[i].get_key_element()}={value}"] + first[i + 1:])


def check_job(overrides: list[str]) -> None:
    """One job composes and its data_dir can be written: Hydra makes its output folder there before the job
    runs, where a failure would be its own multi-line report."""
    check_writable(Path(compose(overrides).data_dir))


def explain(exc: Exception) -> ConfigError:
    """Hydra's composition and override errors as one ConfigError: what was wrong, what to do."""
    from hydra.errors import MissingConfigException, OverrideParseException  # start-up

    text = " ".join(str(exc).split())
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options is not None:
        group, _, name = exc.missing_cfg_file.rpartition("/")
        return ConfigError(f"{group} {name!r} has no config conf/{group}/{name}.yaml",
                           f"use one of: {', '.join(exc.options)}")
    if isinstance(exc, OverrideParseException):
        return ConfigError(f"override {exc.override!r} does not parse ({exc.message.splitlines()[0]})",
                           f"quote a value holding spaces, commas or brackets, e.g. key='a b' (see {GRAMMAR})")
    if text.startswith("Could not override"):
        key = text.split("'")[1]
        return ConfigError(f"override {key} names a key the config does not have",
                           f"check its spelling against conf/, or write +{key}=... to add a new key")
    if text.startswith("Ambiguous value for argument"):
        return ConfigError(f"override {text.split(chr(39))[1]} gives several values",
                           "add --multirun to sweep over them, or write key=[a,b] for a list")
    cause = f" ({' '.join(str(exc.__cause__).split())})" if exc.__cause__ else ""
    return ConfigError(f"the configuration does not compose: {text.rstrip('.')}{cause}",
                       f"fix that override or YAML file (override syntax: {GRAMMAR})")


def check_writable(data_dir: Path) -> None:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=data_dir, prefix=".write-probe-"):   # unique: sweeps run in parallel
            pass
    except OSError as exc:
        raise ConfigError(f"data directory {data_dir} is not writable ({exc.strerror})",
                          "set data_dir=... or ROI_LADDER_HOME to a writable folder") from None
