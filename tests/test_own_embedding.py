"""A user's own embedding folder with their own texts: query/passage pairs become recall@k, every text the
cosine check and the workload."""
import contextlib
import json
from pathlib import Path

import own_models
import pytest
from conftest import compose

from experiments.core.errors import ConfigError
from experiments.targets import retrieval_file
from experiments.targets.models.minilm import RetrievalSet


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return own_models.encoder(tmp_path_factory.mktemp("own") / "tiny-bert")


def write_lines(path, *lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def pairs_file(path, n=12, texts=("a plain text to embed", "another one, longer than the first")):
    rs = RetrievalSet.from_stdlib(n, seed=3)
    lines = [{"query": q, "passage": p} for q, p in zip(rs.queries, rs.passages)]
    return write_lines(path, *lines, "", *[{"text": t} for t in texts[:1]], *[{"prompt": t} for t in texts[1:]])


# --- reading the file -------------------------------------------------------------------------------------
def test_pairs_become_a_retrieval_set_and_plain_lines_texts(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", {"query": "q1", "passage": "p1"}, {"text": "t"},
                       {"query": "q2", "passage": "p2"}, {"query": "q3", "passage": "p1"}, {"prompt": "u"})
    own = retrieval_file.read(path)
    assert own.retrieval.queries == ("q1", "q2", "q3") and own.retrieval.passages == ("p1", "p2")
    assert own.retrieval.relevant == (0, 1, 0)             # one passage answering two queries is one passage
    assert own.extra == ("t", "u") and own.texts() == ["q1", "q2", "q3", "p1", "p2", "t", "u"]


def test_plain_texts_alone_have_no_retrieval(tmp_path):
    own = retrieval_file.read(write_lines(tmp_path / "t.jsonl", {"text": "a"}, {"prompt": "b"}))
    assert own.retrieval is None and own.texts() == ["a", "b"]


@pytest.mark.parametrize("lines,message", [
    ([], "is empty"),
    ([{"text": "a"}, "{oops"], r"line 2 is not valid JSON"),
    ([{"text": "a"}, {"text": "b"}, [1]], r"line 3 is a JSON list, not an object"),
    ([{"query": "q"}], r"line 1 has a \"query\" without its \"passage\""),
    ([{"text": "a"}, {"passage": "p"}], r"line 2 has a \"passage\" without its \"query\""),
    ([{"query": "q", "passage": "p", "text": "t"}], r"line 1 has query and text of"),
    ([{"max_tokens": 3}], r"line 1 has none of"),
    ([{"query": "q", "passage": ""}, {"query": "r", "passage": "s"}], r"line 1: \"passage\" is not a non-empty"),
    ([{"messages": [{"role": "user", "content": "hi"}]}], r"line 1 holds chat messages"),
    ([{"query": "q", "passage": "p"}, {"query": "r", "passage": "p"}], r"only one distinct passage"),
    ([{"text": "a"}], r"a single text"),
])
def test_a_bad_line_is_refused_with_its_number(tmp_path, lines, message):
    with pytest.raises(ConfigError, match=message):
        retrieval_file.read(write_lines(tmp_path / "t.jsonl", *lines))


def test_a_query_passage_line_is_still_refused_for_a_causal_lm(tmp_path):
    from experiments.targets import prompts_file

    path = write_lines(tmp_path / "t.jsonl", {"query": "q", "passage": "p"})
    with pytest.raises(ConfigError, match="line 1 is a query/passage pair.*not a causal LM"):
        prompts_file.read(path, None, [4], None, 0)


# --- the kind: workload and scores ------------------------------------------------------------------------
@contextlib.contextmanager
def stage(_text):
    yield type("Stage", (), {"progress": staticmethod(lambda *a, **k: None)})()


def embedding_kind(encoder, tmp_path, *overrides):
    from experiments.targets import kinds
    from experiments.targets.resolve import resolve

    cfg = compose([f"data_dir={tmp_path}", "target=folder", f"target.source={encoder}", *overrides])
    target, texts, include = resolve(cfg.target, tmp_path / "cache", tmp_path, print)
    assert target.kind == "embedding"
    return kinds.for_target(cfg, target, texts, include)


def test_the_users_pairs_are_scored_by_recall_and_every_text_by_cosine(encoder, tmp_path):
    from experiments.core.recipe import Candidate
    from experiments.judge.embedding_eval import USER_TASK_NAME
    from experiments.serving import build_engine
    from optimizers.baseline import EagerBaseline

    path = pairs_file(tmp_path / "own.jsonl")
    kind = embedding_kind(encoder, tmp_path, f"target.workload.prompts={path}", "target.workload.requests=16")
    assert len(kind.texts) == 12 + 12 + 2
    workload = kind.workload()
    ids = {tuple(kind.tokenizer(t, truncation=True, max_length=128)["input_ids"]) for t in kind.texts}
    assert len(workload.prompts) == 16 and all(p.token_ids in ids for p in workload.prompts)   # the file's texts
    engine = build_engine(EagerBaseline().apply(Candidate(kind_target(kind, encoder))), 1, tmp_path / "artefacts")
    acc, cosine = kind.score(engine, stage, "baseline")
    assert [(a.task, a.metric) for a in acc] == [(USER_TASK_NAME, "recall@1"), (USER_TASK_NAME, "recall@5")]
    assert len(acc[0].per_doc) == 12 and acc[0].value <= acc[1].value
    assert cosine.n == 26 and cosine.min > 0.9999             # the baseline against itself
    assert kind.judge(cosine)[0].passed


def kind_target(kind, encoder):
    from experiments.core.recipe import Target

    return Target("tiny-bert", "embedding", Path(encoder))


def test_texts_without_pairs_are_scored_by_cosine_alone(encoder, tmp_path):
    from experiments.core.recipe import Candidate
    from experiments.serving import build_engine
    from optimizers.baseline import EagerBaseline

    path = write_lines(tmp_path / "own.jsonl", {"text": "first text"}, {"text": "second text"}, {"prompt": "third"})
    kind = embedding_kind(encoder, tmp_path, f"target.workload.prompts={path}")
    engine = build_engine(EagerBaseline().apply(Candidate(kind_target(kind, encoder))), 1, tmp_path / "artefacts")
    acc, cosine = kind.score(engine, stage, "baseline")
    assert acc == [] and cosine.n == 3


def test_recall_at_more_passages_than_the_file_has_is_refused(encoder, tmp_path):
    path = pairs_file(tmp_path / "own.jsonl", n=3)
    with pytest.raises(ConfigError, match=r"recall_at \[1, 5\] asks for the top 5 of the 3 distinct passages"):
        embedding_kind(encoder, tmp_path, f"target.workload.prompts={path}")


def test_a_bad_line_is_refused_before_the_model_is_loaded(encoder, tmp_path):
    path = write_lines(tmp_path / "own.jsonl", {"query": "q", "passage": "p"}, {"query": "r"})
    with pytest.raises(ConfigError, match=r"own.jsonl line 2 has a \"query\" without its \"passage\""):
        embedding_kind(encoder, tmp_path, f"target.workload.prompts={path}")


def test_without_a_file_the_builtin_retrieval_set_scores_it(encoder, tmp_path):
    kind = embedding_kind(encoder, tmp_path, "target.scoring.queries=50", "target.workload.texts=40")
    assert len(kind.retrieval.queries) == 50 and len(kind.texts) == 80 and kind.task == "minilm_retrieval"


def test_a_bad_line_of_an_encoders_file_is_refused_by_validate_before_anything_is_recorded(encoder, tmp_path):
    from experiments.climb.validation import validate

    path = write_lines(tmp_path / "t.jsonl", {"query": "q", "passage": "p"}, {"query": "r"})
    cfg = compose([f"data_dir={tmp_path / 'data'}", "target=folder", f"target.source={encoder}",
                   f"target.workload.prompts={path}"])
    with pytest.raises(ConfigError, match="line 2"):
        validate(cfg)
    assert not (tmp_path / "data" / "mlflow.db").exists()
