"""An lm-eval task's data must be on this machine: nothing downloads at run time (HF_HUB_OFFLINE=1).

Checked before any work, from the task's own config: a dataset_path that is a local file format (`json`, ...)
or a folder is fine; a Hugging Face dataset must already be in the local datasets cache."""
from __future__ import annotations

from pathlib import Path

from experiments.core.errors import ConfigError
from experiments.judge.accuracy import task_index

LOCAL_BUILDERS = {"json", "csv", "text", "parquet", "arrow"}


def check_offline(tasks: list[str], include_path: Path | None) -> None:
    index = task_index(tuple(tasks), include_path).task_index
    for name in tasks:
        entry = index.get(name)
        cfg = (entry.cfg or {}) if entry is not None else {}
        dataset = cfg.get("dataset_path")
        if not dataset or dataset in LOCAL_BUILDERS or Path(str(dataset)).expanduser().exists():
            continue
        subset = cfg.get("dataset_name")
        try:
            import datasets  # heavy

            datasets.load_dataset_builder(dataset, subset)
        except Exception as exc:   # offline, datasets raises one of several types; the point is the same
            shown = f"{dataset}" + (f" ({subset})" if subset else "")
            raise ConfigError(
                f"lm-eval task {name!r} reads the Hugging Face dataset {shown}, which is not available offline "
                f"here ({type(exc).__name__})",
                f"download it where there is internet (datasets.load_dataset({dataset!r}"
                f"{', ' + repr(subset) if subset else ''})) and copy the Hugging Face cache (~/.cache/huggingface) "
                f"here, or write your own task YAML with dataset_path: json over local files and pass its folder as "
                f"accuracy.include_path") from None
