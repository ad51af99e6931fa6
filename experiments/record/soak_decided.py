"""Promotion asks for a decided soak: a champion whose sweep soak was too short to tell a leak is promoted only
once `roi-ladder soak` (experiments/climb/followup_soak.py) has soaked it long enough to decide."""
from __future__ import annotations

from experiments.core.errors import ConfigError
from experiments.core.names import Tag


def require(run) -> None:
    """A champion whose soak could not tell a leak is promoted only once a longer soak has decided."""
    soak, later = run.data.tags.get(Tag.SOAK, ""), run.data.tags.get(Tag.SOAK_FOLLOWUP, "")
    if "not decided" not in soak or later.startswith("clean"):
        return
    rid = run.info.run_id
    if later.startswith("not decided"):
        raise ConfigError(f"run {rid}'s longer soak did not decide either: {later[:300]}",
                          f"soak it longer: roi-ladder soak --run {rid} soak.duration_s=3600")
    if later:
        raise ConfigError(f"run {rid}'s longer soak was {later[:300]}",
                          "promote another rung; this one did not hold under a long load")
    raise ConfigError(f"run {rid} ({run.data.tags.get(Tag.RUNG)!r}) was soaked too briefly to tell a leak: "
                      f"{soak}", f"soak it at the production profile's length first (4 min warm-up, then 30 min): "
                                 f"roi-ladder soak --run {rid} (make soak RUN={rid}), then promote")
