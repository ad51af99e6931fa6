"""A user's own Hugging Face folder as the target: kind detection, refusals, the prompts file, agreement."""
import json
import shutil

import own_models
import pytest
from conftest import compose

from experiments.core.errors import ConfigError
from experiments.judge.agreement import BaselineGenerations, judge, lower_bound
from experiments.targets import prompts_file
from experiments.targets.folder import inspect
from experiments.targets.kinds import detect as detect_kind
from experiments.targets.resolve import check_source


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return own_models.build(tmp_path_factory.mktemp("own") / "tiny-llama", "LlamaForCausalLM")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return own_models.build(tmp_path_factory.mktemp("own") / "tiny-qwen2", "Qwen2ForCausalLM")


def tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def write_lines(path, *lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


# --- the folder -------------------------------------------------------------------------------------------
def test_kind_is_detected_from_the_folder(llama, qwen, tmp_path):
    assert inspect(llama).kind == inspect(qwen).kind == "causal-lm"
    assert inspect(qwen).architecture == "Qwen2ForCausalLM" and inspect(qwen).context_length == 256
    assert detect_kind(tmp_path, "BertModel") == "embedding"          # a bare encoder
    (tmp_path / "modules.json").write_text("[]")
    assert detect_kind(tmp_path, "Qwen3Model") == "embedding"         # a sentence-transformers folder


def test_folder_config_names_the_target_after_the_folder(llama):
    cfg = compose([f"data_dir={llama.parent}", "target=folder", f"target.source={llama}"])
    assert cfg.target.name == "tiny-llama" and cfg.tracking.experiment == "roi-ladder/tiny-llama"
    assert list(cfg.accuracy.tasks) == []                                # no task unless the user gives one
    check_source(cfg.target)


def test_a_kind_that_does_not_match_the_folder_is_one_error(llama):
    with pytest.raises(ConfigError, match="target.kind=embedding does not match .*LlamaForCausalLM.*causal-lm"):
        inspect(llama, "embedding")


def test_a_model_that_needs_remote_code_is_refused(llama, tmp_path):
    folder = shutil.copytree(llama, tmp_path / "remote")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_mine.MyModel"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="needs trust_remote_code.*AutoModelForCausalLM"):
        inspect(folder)


def test_an_architecture_transformers_does_not_ship_is_refused(llama, tmp_path):
    folder = shutil.copytree(llama, tmp_path / "unknown")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["MadeUpForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="'MadeUpForCausalLM' is not shipped by transformers"):
        inspect(folder)


def test_a_folder_with_a_builtin_config_says_to_use_target_folder(llama):
    with pytest.raises(ConfigError, match="add target=folder"):
        check_source(compose([f"data_dir={llama.parent}", f"target.source={llama}"]).target)


# --- the prompts file -------------------------------------------------------------------------------------
def read(path, folder, context=256):
    return prompts_file.read(path, tokenizer(folder), [4, 8], context, seed=0)


def test_prompts_and_chat_messages_become_requests(qwen, tmp_path):
    path = write_lines(tmp_path / "p.jsonl", {"prompt": "import os\n"}, "",
                       {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    first, chat = read(path, qwen)
    assert (first.line, chat.line, chat.max_tokens) == (1, 3, 5) and first.max_tokens in (4, 8)
    assert chat.text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert list(chat.token_ids) == tokenizer(qwen)(chat.text, add_special_tokens=False)["input_ids"]
    workload = prompts_file.workload([first, chat], warmup_count=3, seed=0)
    assert [p.max_new_tokens for p in workload.prompts] == [first.max_tokens, 5] and len(workload.warmup) == 3


@pytest.mark.parametrize("lines,message", [
    ([], "is empty"),
    ([{"prompt": "a"}, "{not json"], r"line 2 is not valid JSON"),
    ([{"prompt": "a"}, {"prompt": "b"}, ["a"]], r"line 3 is a JSON list, not an object"),
    ([{"text": "a"}], r"line 1 has neither \"prompt\" and \"messages\""),
    ([{"prompt": "a", "max_tokens": 0}], r"line 1: max_tokens 0 is not an integer >= 1"),
    ([{"prompt": "a"}, {"query": "q", "passage": "p"}], r"line 2 is a query/passage pair.*not a causal LM"),
    ([{"messages": [{"role": "user"}]}], r"line 1: \"messages\" is not a list"),
])
def test_a_bad_prompts_file_names_its_line(qwen, tmp_path, lines, message):
    with pytest.raises(ConfigError, match=message):
        read(write_lines(tmp_path / "p.jsonl", *lines), qwen)


def test_a_missing_prompts_file_is_refused(qwen, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        read(tmp_path / "nope.jsonl", qwen)


def test_chat_messages_need_a_chat_template(llama, tmp_path):
    path = write_lines(tmp_path / "p.jsonl", {"prompt": "a"}, {"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(ConfigError, match="line 2 holds chat messages, but the model's tokenizer has no chat template"):
        read(path, llama)


def test_a_prompt_longer_than_the_context_is_refused_naming_the_line(qwen, tmp_path):
    path = write_lines(tmp_path / "p.jsonl", {"prompt": "x"}, {"prompt": "def f(x):\n    return x\n" * 40})
    with pytest.raises(ConfigError, match=r"line 2: \d+ prompt tokens \+ \d output tokens exceed the model's "
                                          r"context window of 256"):
        read(path, qwen)


def test_a_synthetic_workload_longer_than_the_context_is_refused(qwen, tmp_path):
    from experiments.core.recipe import Target
    from experiments.targets.kinds.causal_lm import CausalLMScorer

    cfg = compose([f"data_dir={tmp_path}", "target=folder", f"target.source={qwen}",
                   "target.workload.input_tokens=[200]", "target.workload.output_tokens=[64]"])
    kind = CausalLMScorer(cfg, Target("q", "causal-lm", qwen), ["def f(x):\n    return x\n" * 2000], None)
    with pytest.raises(ConfigError, match="up to 264 tokens .* context window of 256"):
        kind.workload()


# --- generation agreement ---------------------------------------------------------------------------------
class Repeat:
    """Scores as Echo decodes: the next token is the current one, 8 nats ahead of any other."""
    def __init__(self):
        import torch

        self.model = torch.nn.Identity()
        self.model.device = torch.device("cpu")
        self.serving_forward = lambda input_ids, use_cache=False: _Logits(8.0 * torch.eye(32)[input_ids])


class _Logits:
    def __init__(self, logits):
        self.logits = logits


class Echo(Repeat):
    """Greedy 'decoding' that repeats the prompt's last token, or a constant when broken."""
    def __init__(self, broken_on=()):
        super().__init__()
        self.broken_on = set(broken_on)

    def generate(self, prompt_ids, max_new_tokens):
        for i in range(max_new_tokens):
            yield (0 if prompt_ids[0] in self.broken_on and i >= 2 else prompt_ids[-1]), 0.0


def test_generation_agreement_counts_identical_greedy_outputs():
    prompts = [[i, i + 1] for i in range(20)]
    reference = BaselineGenerations.record(Echo(), prompts, tokens=6)
    same = reference.compare(Echo(), near_tie=1.0)
    assert (same.agreed, same.share, same.first_divergence) == (20, 1.0, -1.0)
    broken = reference.compare(Echo(broken_on=range(1, 20)), near_tie=1.0)   # 0 where the baseline was 8 nats sure
    assert broken.agreed == 1 and broken.first_divergence == 2.0
    assert judge(same, 0.5).passed and not judge(broken, 0.5).passed
    assert 0.83 < lower_bound(20, 20, 0.95) < 0.9          # Wilson: 20/20 does not prove 100 %


# --- GGUF -------------------------------------------------------------------------------------------------
def _madeup_gguf(path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch="madeup")
    writer.add_tensor("x", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_of_an_architecture_the_loader_does_not_know_is_refused(tmp_path):
    from experiments.targets.models.gguf import convert

    path = _madeup_gguf(tmp_path / "madeup.gguf")
    with pytest.raises(ConfigError, match="architecture 'madeup', which transformers' GGUF loader does not know"):
        convert(path, tmp_path / "out")


def test_the_tokenizer_check_refuses_a_tokenizer_that_loses_spaces(qwen):
    from tokenizers import normalizers

    from experiments.targets.models.gguf import check_round_trip

    tok = tokenizer(qwen)
    check_round_trip(tok, "tiny-qwen2", reference=tokenizer(qwen))

    class SplitsOtherwise:   # another vocabulary's ids for the same text: round-trips, but not the model's
        def encode(self, text, add_special_tokens=False):
            return [i + 1 for i in tok.encode(text, add_special_tokens=add_special_tokens)]

    with pytest.raises(RuntimeError, match="not as the GGUF's vocabulary does"):
        check_round_trip(tok, "tiny-qwen2", reference=SplitsOtherwise())
    tok.backend_tokenizer.normalizer = normalizers.Replace(" ", "")
    with pytest.raises(RuntimeError, match="does not round-trip"):
        check_round_trip(tok, "tiny-qwen2")


@pytest.mark.slow
def test_smollm2s_gguf_tokenizer_round_trips_where_the_loaders_does_not(tmp_path):
    """The measured trap: transformers' own GGUF tokenizer, saved and loaded again, encodes spaces as
    <|endoftext|>; ours, built from the same GGUF, round-trips and ends turns with <|im_end|>."""
    from transformers import AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from experiments.targets.models.gguf import check_round_trip, gguf_tokenizer
    from experiments.targets.models.smollm2 import gguf_file

    path = gguf_file()
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(tmp_path / "theirs")
    with pytest.raises(RuntimeError, match="does not round-trip"):
        check_round_trip(AutoTokenizer.from_pretrained(tmp_path / "theirs"), path.name)
    built = gguf_tokenizer(load_gguf_checkpoint(str(path)), "llama")
    built.save_pretrained(tmp_path / "ours")
    ours = AutoTokenizer.from_pretrained(tmp_path / "ours")
    check_round_trip(ours, path.name, reference=built)   # saved and loaded again, it encodes as built
    assert (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert ours("Paris").input_ids == ours("Paris", add_special_tokens=False).input_ids   # no BOS prepended


def test_agreement_compares_the_answer_up_to_the_baselines_stop_token():
    """torch emits the stop token and goes on; ONNX Runtime bans it (min_length) and emits another: both served
    the same answer, which is what agreement compares."""
    class EmitsStop(Repeat):
        def generate(self, prompt_ids, max_new_tokens):
            for i in range(max_new_tokens):
                yield (9 if i == 2 else prompt_ids[-1]), 0.0

    class BansStop(Repeat):
        def generate(self, prompt_ids, max_new_tokens):
            for i in range(max_new_tokens):
                yield (7 if i == 2 else prompt_ids[-1]), 0.0

    reference = BaselineGenerations.record(EmitsStop(), [[1, 2]], tokens=6, stop_ids=[9])
    assert reference.outputs == ((2, 2),) and reference.compare(BansStop(), near_tie=1.0).exact == 1
    assert BaselineGenerations.record(BansStop(), [[1, 2]], tokens=6, stop_ids=[9]).compare(EmitsStop(),
                                                                                          near_tie=1.0).exact == 0


def test_an_lm_eval_task_whose_data_is_not_offline_is_refused_naming_the_dataset(monkeypatch):
    from experiments.targets.task_data import check_offline

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"task 'hellaswag' reads the Hugging Face dataset Rowan/hellaswag, which is "
                                          r"not available offline.*load_dataset\('Rowan/hellaswag'\)"):
        check_offline(["hellaswag"], None)


# --- refused in validate(), before the MLflow experiment exists or the model is built ----------------------------
LONG = "def f(x):\n    return x\n" * 40
BEFORE_WORK = [
    ("qwen", [{"prompt": "a"}, "{not json"], [], r"line 2 is not valid JSON"),
    ("llama", [{"prompt": "a"}, {"messages": [{"role": "user", "content": "hi"}]}], [],
     r"line 2 holds chat messages, but the model's tokenizer has no chat template"),
    ("qwen", [{"prompt": "x"}, {"prompt": LONG}], [], r"line 2: \d+ prompt tokens .* context window of 256"),
    ("qwen", [{"query": "q", "passage": "p"}], [], r"line 1 is a query/passage pair.*not a causal LM"),
    ("qwen", None, ["target.workload.input_tokens=[200]", "target.workload.output_tokens=[64]"],
     r"up to 264 tokens .* context window of 256"),
    ("qwen", [{"prompt": "a"}], ["accuracy.tasks=[hellaswag]"], r"Rowan/hellaswag, which is not available offline"),
    ("gguf", None, [], r"architecture 'madeup', which transformers' GGUF loader does not know"),
]


@pytest.mark.parametrize("model, lines, extra, message", BEFORE_WORK,
                         ids=["bad-line", "chat-no-template", "past-context", "pair-for-causal-lm",
                              "synthetic-past-context", "task-not-offline", "gguf-unknown-architecture"])
def test_a_users_bad_data_is_refused_by_validate_before_anything_is_recorded(model, lines, extra, message, llama,
                                                                             qwen, tmp_path, monkeypatch):
    from experiments.climb.validation import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = {"llama": llama, "qwen": qwen}.get(model) or _madeup_gguf(tmp_path / "madeup.gguf")
    args = [f"data_dir={tmp_path / 'data'}", "target=folder", f"target.source={source}", *extra]
    if lines is not None:
        args.append(f"target.workload.prompts={write_lines(tmp_path / 'p.jsonl', *lines)}")
    with pytest.raises(ConfigError, match=message):
        validate(compose(args))
    assert not (tmp_path / "data" / "mlflow.db").exists()


def test_a_bad_prompts_line_stops_the_sweep_before_its_experiment_is_created(qwen, tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    prompts = write_lines(tmp_path / "p.jsonl", {"prompt": "a"}, "{not json")
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "sweep", "target=folder",
                           f"target.source={qwen}", f"target.workload.prompts={prompts}",
                           f"data_dir={tmp_path / 'data'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith("error: ") and "line 2 is not valid JSON" in proc.stderr, proc.stderr
    assert not (tmp_path / "data" / "mlflow.db").exists()


def test_a_built_models_prompts_file_is_read_before_its_experiment_is_created(model_dir, tmp_path):
    """A built-in's tokenizer exists once the model is built (here: cached), so its prompts file is read after
    the build; the experiment is created only after that."""
    import subprocess
    import sys

    from conftest import REPO, SHARED_CACHE

    prompts = write_lines(tmp_path / "p.jsonl", {"prompt": "a"}, {"prompt": " ".join(["def f(x): return x"] * 400)})
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "sweep", f"cache_dir={SHARED_CACHE}",
                           f"target.workload.prompts={prompts}", f"data_dir={tmp_path / 'data'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith("error: ") and "line 2" in proc.stderr, proc.stderr
    assert not (tmp_path / "data" / "mlflow.db").exists()


def test_a_kind_the_folder_does_not_show_can_be_given(llama, tmp_path):
    folder = tmp_path / "masked"
    shutil.copytree(llama, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"architectures": ["LlamaModel"]}))
    (folder / "modules.json").unlink(missing_ok=True)
    assert inspect(folder).kind == "embedding"    # a bare *Model reads as an encoder
    config["architectures"] = ["BertForMaskedLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="cannot tell its kind.*set target.kind"):
        inspect(folder)
    assert inspect(folder, "embedding").kind == "embedding"


def test_the_corpus_is_a_file_or_a_folder_of_text_and_a_missing_one_is_refused_before_work(qwen, tmp_path):
    from experiments.climb.validation import validate
    from experiments.targets.models.corpus import texts_from

    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "b.txt").write_text("second text")
    (tmp_path / "docs" / "sub" / "a.md").write_text("first text")
    (tmp_path / "docs" / "blob.bin").write_bytes(b"\xff\xfe\x00 not utf-8 \xff")
    (tmp_path / "docs" / "blank.txt").write_text("  \n")
    assert texts_from(tmp_path / "docs") == ["second text", "first text"]   # sorted paths, binary and blank skipped
    assert texts_from(tmp_path / "docs" / "b.txt") == ["second text"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no UTF-8 text"):
        texts_from(tmp_path / "empty")
    cfg = compose([f"data_dir={tmp_path / 'data'}", "target=folder", f"target.source={qwen}",
                   f"target.workload.corpus={tmp_path / 'nope'}"])
    with pytest.raises(ConfigError, match="target.workload.corpus .*nope does not exist"):
        validate(cfg)
