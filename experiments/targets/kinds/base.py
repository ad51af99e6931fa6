"""What every target kind says about itself (experiments/targets/kinds/<name>.py defines KIND, an instance of a
subclass of Kind); kept apart from the package's registry so that a kind's module imports only downwards."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Scorer(Protocol):
    """A sweep's scoring of its target (Kind.scorer): the workload, each candidate's answers scored in its own
    engine, and the gate's criteria on their drift from the baseline's `reference`."""
    reference: object

    def workload(self): ...

    def score(self, engine, stage, name: str) -> tuple[list, object]: ...

    def score_more(self, engine, reports: list, stage, name: str) -> list: ...   # a causal LM's accuracy: its last look

    def judge(self, drift) -> list: ...


class Kind:
    name: str = ""
    noun: str = ""                 # what a model of this kind is called in messages: "causal LM", "encoder"
    decodes: bool = False          # token by token (decode steps, a KV cache), or one forward pass per request
    metrics: tuple[str, ...] = ()  # the latency metrics its requests have (SLOs on others are left out)
    engines: dict[str, str] = {}   # recipe.engine -> "module:Class" of the engine that runs it
    folders: str = ""              # what its Hugging Face folders look like, for the error that finds none
    packaged_as: str | None = None  # what `roi-ladder promote` registers it as; None: not packaged yet
    throughput_unit: str = ""      # the tables' throughput column: "tokens/s", "embeddings/s"
    key_metrics: tuple[str, ...] = ()  # MLflow metrics a reviewer reads first: the UI's ladder view, a version's tags

    def columns(self, top: int) -> list[tuple[str, str, str]]:
        """(summary key, header, format) of the ladder table's measured columns."""
        raise NotImplementedError

    def throughput(self, level) -> float:
        """One load level's (a level.LevelReport) throughput, in throughput_unit."""
        raise NotImplementedError

    def level_metrics(self, level) -> dict[str, float]:
        """What MLflow records of one load level beyond the latencies, rates and resources every kind has."""
        raise NotImplementedError

    def engine(self, recipe) -> str | None:
        """The "module:Class" of the engine that runs `recipe` for this kind, or None."""
        return self.engines.get(recipe.engine)

    def claims(self, path: Path, architecture: str) -> bool:
        """Whether a Hugging Face folder with this architecture holds a model of this kind."""
        return False

    def check(self, cfg, model_dir: Path | None = None) -> None:
        """Cheap checks of the config before any long work; model_dir: the user's folder, already on disk, that
        the user's data can be checked against (None for a model still to build or convert)."""

    def folder_texts(self, cfg_target, path: Path) -> list[str]:
        """The texts a user's folder of this kind has its workload cut from; refuses what it cannot serve."""
        raise NotImplementedError

    def roofline_shape(self, model_dir: Path):
        """The model's roofline.ModelShape, or None where the roofline's counts do not fit this kind."""
        return None

    def scorer(self, cfg, target, texts: list[str], include_path: Path | None) -> Scorer:
        """The sweep's Scorer: workload(), score(engine, stage, name), judge(report), and the baseline's
        `reference` (kept by the ledger)."""
        raise NotImplementedError


def load_tokenizer(model_dir):
    from transformers import AutoTokenizer  # heavy

    return AutoTokenizer.from_pretrained(model_dir)
