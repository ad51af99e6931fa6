"""The metric the accuracy gate judges each lm-eval task on, read from the task's own config before any work.

The gate pairs the champion's and the challenger's scores document by document, so it needs a metric that lm-eval
records per document and averages (aggregation `mean`: acc, acc_norm, acc_mutual_info, exact_match); a corpus-level
one (perplexity, bleu, f1, mcc) has no per-document value to pair. A task produces only the metrics its
`metric_list` names (lm-eval's defaults for its output_type without one), so a metric asked for that the task
lacks would crash its first scoring: it is refused here, naming the metrics the task has."""
from __future__ import annotations

from dataclasses import dataclass

from experiments.core.errors import ConfigError

FIRST_METRIC = "the task's first per-document metric; gate.accuracy.metric is not set"
CHOSEN = "gate.accuracy.metric"


@dataclass(frozen=True)
class GatedMetric:
    task: str
    metric: str
    chosen_by: str          # CHOSEN or FIRST_METRIC

    def describe(self) -> str:
        return f"{self.task}: {self.metric} ({self.chosen_by})"


def task_metrics(cfg: dict) -> list[tuple[str, object]]:
    """(metric, aggregation as configured or None) in the task's order; lm-eval's defaults without a metric_list."""
    from lm_eval.api.registry import DEFAULT_METRIC_REGISTRY  # heavy

    listed = cfg.get("metric_list")
    if listed:
        return [(m["metric"], m.get("aggregation")) for m in listed if isinstance(m, dict)
                and isinstance(m.get("metric"), str)]
    return [(m, None) for m in DEFAULT_METRIC_REGISTRY.get(cfg.get("output_type") or "generate_until", [])]


def per_document(metric: str, aggregation) -> bool:
    if aggregation is not None:
        return aggregation == "mean"
    from lm_eval.api.metrics import mean  # heavy
    from lm_eval.api.registry import get_metric_aggregation  # heavy

    return get_metric_aggregation(metric) is mean


def gated_metrics(tasks: list[str], index: dict, chosen: str | None) -> list[GatedMetric]:
    """Per task, the metric to gate on: `chosen`, or the task's first per-document metric. `index`: lm-eval's
    TaskManager.task_index (name -> Entry, configs parsed, functions unresolved)."""
    from lm_eval.tasks._index import Kind  # heavy

    out = []
    for task in tasks:
        entry = index[task]
        if entry.kind in (Kind.GROUP, Kind.TAG):
            members = (entry.cfg or {}).get("task") or sorted(n for n, e in index.items() if task in (e.tags or ()))
            shown = ", ".join(str(m) for m in members[:6]) + (" ..." if len(members) > 6 else "")
            raise ConfigError(f"accuracy.tasks names {task!r}, a {entry.kind.name.lower()} of lm-eval tasks; the "
                              f"gate pairs one task's documents", f"list its tasks instead: {shown}")
        metrics = task_metrics(entry.cfg or {})
        usable = [m for m, agg in metrics if per_document(m, agg)]
        has = ", ".join(m for m, _ in metrics) or "none"
        if chosen is not None:
            if chosen not in usable:
                why = "does not produce" if chosen not in dict(metrics) else "does not average per document"
                raise ConfigError(f"gate.accuracy.metric={chosen} but lm-eval task {task!r} {why} it (its metrics: "
                                  f"{has}; per document: {', '.join(usable) or 'none'})",
                                  "set gate.accuracy.metric to one of the task's per-document metrics, or to null "
                                  "for each task's first")
            out.append(GatedMetric(task, chosen, CHOSEN))
        elif not usable:
            raise ConfigError(f"lm-eval task {task!r} has no per-document metric the gate can pair (its metrics: "
                              f"{has})", "add a metric with aggregation: mean (acc, exact_match, ...) to its "
                                         "metric_list, or drop the task from accuracy.tasks")
        else:
            out.append(GatedMetric(task, usable[0], FIRST_METRIC))
    return out
