"""What a distilled student learns from: the target's own text, never the documents the gate then scores.

The first source there is: the target's prompts file and corpus (the user's traffic and text, both when both
are given); the standard library's training split, for a target that names one (the built-ins: tiny-llm was
trained on it, and the built-ins' workloads and fidelity windows are its held-out files); else the documents of
the accuracy tasks that the gate does not score (a split other than the one it evaluates, and those past
accuracy.limit). A student trained on the scored documents would have learnt the answers the gate checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiments.judge.accuracy import task_index
from experiments.targets import prompts_file
from experiments.targets.kinds import load_tokenizer
from experiments.targets.models.corpus import Corpus, texts_from

GIVE_TEXT = ("give the model's own text: target.workload.prompts=FILE.jsonl (its traffic) or "
             "target.workload.corpus=FILE_OR_DIR")


class NoTrainingText(ValueError):
    """Nothing of the target's own to train a student on; the message says what to give."""


@dataclass(frozen=True)
class TrainingText:
    source: str                # what the student learns from, for the run's record
    texts: tuple[str, ...]


@dataclass(frozen=True)
class Sources:
    """Where a student's training text may come from, as the sweep's config says (conf/rung/distillation.yaml)."""
    prompts: str | None = None               # target.workload.prompts, when it is a file (a built-in's is a count)
    corpus: str | None = None                # target.workload.corpus
    stdlib_heldout_every: int | None = None  # the stdlib's split, for a target whose own text it is
    tasks: tuple[str, ...] = ()              # accuracy.tasks
    include_path: str | None = None          # accuracy.include_path
    limit: int | None = None                 # accuracy.limit: the gate scores each task's first `limit` documents


def training_text(src: Sources, model_dir: Path) -> TrainingText:
    """The student's training text, from the first source `src` has; NoTrainingText when it has none."""
    own = []
    if src.prompts:
        own.append(TrainingText(f"prompts file {src.prompts}", tuple(prompt_texts(Path(src.prompts), model_dir))))
    if src.corpus:
        own.append(TrainingText(f"corpus {src.corpus}", tuple(texts_from(src.corpus))))
    if own:
        return TrainingText(" + ".join(t.source for t in own), tuple(x for t in own for x in t.texts))
    if src.stdlib_heldout_every:
        corpus = Corpus.from_stdlib(int(src.stdlib_heldout_every))
        return TrainingText(f"the Python standard library's training split ({len(corpus.train)} files; every "
                            f"{src.stdlib_heldout_every}th, by crc32, held out)", tuple(corpus.train))
    if src.tasks:
        return task_documents(src.tasks, src.include_path, src.limit)
    raise NoTrainingText(f"no training text of the model's own: {GIVE_TEXT}")


def prompt_texts(path: Path, model_dir: Path) -> list[str]:
    """Each request of the prompts file as the model sees it (chat messages rendered with its template)."""
    return [r.text for r in prompts_file.read(path, load_tokenizer(model_dir), (1,), None, 0)]


def task_documents(tasks, include_path, limit) -> TrainingText:
    """Question and answer of every document of the tasks that the gate does not score."""
    manager = task_index(tuple(tasks), Path(include_path) if include_path else None)
    texts, parts, scored_texts = [], [], set()
    for name, task in manager.load(list(tasks))["tasks"].items():
        eval_docs = list(task.eval_docs)
        scored = eval_docs if limit is None else eval_docs[:int(limit)]
        scored_texts |= {document_text(task, d) for d in scored}
        for what, docs in unscored_documents(task, eval_docs, limit):
            texts += [document_text(task, d) for d in docs]
            parts.append(f"{len(docs)} {what} documents of {name}")
    kept = [t for t in texts if t not in scored_texts]   # a split may repeat a document the gate scores
    if not kept:
        raise NoTrainingText(f"no training text of the model's own, and every document of {', '.join(tasks)} is one "
                             f"the gate scores (training on them would inflate its accuracy): {GIVE_TEXT}, or "
                             f"a task with a training split (or accuracy.limit below its document count)")
    dropped = f"; {len(texts) - len(kept)} left out, equal to a scored one" if len(kept) < len(texts) else ""
    return TrainingText(f"the accuracy tasks' documents the gate does not score: {', '.join(parts)}{dropped}",
                        tuple(kept))


def unscored_documents(task, eval_docs: list, limit) -> list[tuple[str, list]]:
    """(what, documents) for each split the gate does not evaluate, and the evaluated split past `limit`."""
    cfg = task.config
    evaluated = cfg.test_split if task.has_test_docs() else cfg.validation_split
    out = []
    for split, has, docs in ((cfg.training_split, task.has_training_docs, task.training_docs),
                             (cfg.validation_split, task.has_validation_docs, task.validation_docs)):
        if split and split != evaluated and has():
            out.append((f"{split}-split", list(docs())))
    if limit is not None and len(eval_docs) > int(limit):
        out.append((f"{evaluated}-split past accuracy.limit={limit}", eval_docs[int(limit):]))
    return [(what, docs) for what, docs in out if docs]


def document_text(task, doc) -> str:
    """The document's prompt followed by its answer, as the task joins them."""
    text, target = task.doc_to_text(doc), task.doc_to_target(doc)
    if task.OUTPUT_TYPE == "multiple_choice":
        choices = task.doc_to_choice(doc)
        text = choices[text] if isinstance(text, int) else text   # a task whose context is one of the choices
        target = choices[target] if isinstance(target, int) else target
    if isinstance(target, list):
        target = target[0] if target else ""
    return f"{text}{task.config.target_delimiter}{target}"
