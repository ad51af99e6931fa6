"""builtin:tiny-llm — a Llama-architecture causal LM and its BPE tokenizer, trained here, offline and seeded.

The build is cached under `<data_dir>/models/tiny-llm-<hash of recipe>`; a manifest of checksums lets a
later run detect a corrupted cache and rebuild instead of serving broken weights.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from experiments.core.artefacts import source_digest
from experiments.core.cache import build_once, write_atomic
from experiments.targets.models.corpus import Corpus, code_lines

log = logging.getLogger(__name__)

TASK_NAME = "tiny_llm_nextline"
BUILD_FORMAT = 3   # bump when the build or task code changes what a recipe produces
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]


@dataclass(frozen=True)
class TinyLlmRecipe:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    seq_len: int
    batch_size: int
    steps: int
    lr: float
    seed: int
    heldout_every: int
    task_items: int
    task_context_lines: int
    threads: int

    def key(self, corpus: Corpus) -> str:
        import tokenizers  # heavy
        import torch  # heavy
        import transformers  # heavy

        blob = json.dumps(
            {"format": BUILD_FORMAT, "code": source_digest(TinyLlmRecipe),
             "recipe": asdict(self), "corpus": corpus.fingerprint, "python": platform.python_version(),
             "torch": torch.__version__, "transformers": transformers.__version__,
             "tokenizers": tokenizers.__version__},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def built_dir(recipe: TinyLlmRecipe, data_dir: Path, corpus: Corpus | None = None) -> Path:
    """Where the model of `recipe` is (or would be) built."""
    corpus = corpus or Corpus.from_stdlib(recipe.heldout_every)
    return Path(data_dir) / "models" / f"tiny-llm-{recipe.key(corpus)}"


def ensure_built(recipe: TinyLlmRecipe, data_dir: Path, progress: Callable[[str], None] = log.info,
                 on_step: Callable[[int, int], None] | None = None) -> Path:
    """Return the folder of the built model, building it only if no valid cached copy exists; on_step(done,
    total) after each training step."""
    corpus = Corpus.from_stdlib(recipe.heldout_every)
    out = built_dir(recipe, data_dir, corpus)
    built = {}

    def build(tmp: Path) -> None:
        started = time.perf_counter()
        tokenizer = _train_tokenizer(recipe, corpus, tmp)
        progress(f"tokenizer trained ({tokenizer.vocab_size} tokens); training {recipe.steps} steps")
        model, final_loss = _train_model(recipe, corpus, tokenizer, progress, on_step)
        model.save_pretrained(tmp, safe_serialization=True)
        _write_task(recipe, corpus, tmp)
        built.update(recipe=asdict(recipe), corpus=corpus.fingerprint, final_train_loss=final_loss,
                     build_seconds=round(time.perf_counter() - started, 1),
                     parameters=sum(p.numel() for p in model.parameters()))
        (tmp / "build.json").write_text(json.dumps(built, indent=2))

    if not build_once(out, build, "cached model", progress):
        progress(f"built tiny-llm in {built['build_seconds']} s (final train loss {built['final_train_loss']:.3f})")
    return out


# The built-in models' lm-eval task YAMLs, copied beside their data at build time (indexable before it).
SHIPPED_TASKS = Path(__file__).parent / "tasks"


def task_dir(model_dir: Path) -> Path:
    return Path(model_dir) / "lm_eval_tasks"


# --- tokenizer ------------------------------------------------------------------------------------------
def _train_tokenizer(recipe: TinyLlmRecipe, corpus: Corpus, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # heavy
    from transformers import PreTrainedTokenizerFast  # heavy

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=recipe.vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus.train, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   model_max_length=recipe.seq_len * 4)
    fast.save_pretrained(out)
    return fast


# --- model ----------------------------------------------------------------------------------------------
def adamw_warmup_cosine(model, lr: float, steps: int):
    """AdamW with a 5 % linear warm-up, then cosine decay: the schedule both the build and distillation use."""
    import torch  # heavy

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    return opt, sched


def _train_model(recipe: TinyLlmRecipe, corpus: Corpus, tokenizer, progress, on_step=None):
    import torch  # heavy
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # heavy

    torch.manual_seed(recipe.seed)
    torch.set_num_threads(recipe.threads)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size, intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers, num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads, max_position_embeddings=recipe.seq_len * 4,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    stream = []
    for text in corpus.train:
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        stream.append(tokenizer.eos_token_id)
    data = torch.tensor(stream, dtype=torch.long)
    gen = torch.Generator().manual_seed(recipe.seed)
    opt, sched = adamw_warmup_cosine(model, recipe.lr, recipe.steps)
    model.train()
    loss_ema = None
    for step in range(recipe.steps):
        starts = torch.randint(0, len(data) - recipe.seq_len - 1, (recipe.batch_size,), generator=gen)
        batch = torch.stack([data[s: s + recipe.seq_len] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        if on_step:
            on_step(step + 1, recipe.steps)
        if (step + 1) % max(1, recipe.steps // 10) == 0:
            progress(f"train step {step + 1}/{recipe.steps} loss {loss_ema:.3f}")
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False)
    return model, float(loss_ema)


# --- lm-eval task: pick the true next line among four, from held-out files ------------------------------
def _write_task(recipe: TinyLlmRecipe, corpus: Corpus, out: Path) -> None:
    rng = random.Random(recipe.seed)
    files = [code_lines(t) for t in corpus.heldout]
    pool = [ln for lines in files for ln in lines if len(ln.strip()) >= 8]
    n_ctx = recipe.task_context_lines
    positions = [(fi, i) for fi, lines in enumerate(files) for i in range(n_ctx, len(lines))
                 if len(lines[i].strip()) >= 8]
    rng.shuffle(positions)
    by_length: dict[int, list[str]] = {}
    for ln in pool:
        by_length.setdefault(len(ln) // 8, []).append(ln)
    docs = []
    for fi, i in positions:
        if len(docs) == recipe.task_items:
            break
        target = files[fi][i]
        # Distractors of about the same length, so that a short-line bias cannot pass for knowledge.
        similar = [ln for ln in by_length.get(len(target) // 8, []) if ln != target]
        distractors = rng.sample(sorted(set(similar)), 3) if len(set(similar)) >= 3 else []
        if not distractors:
            continue
        choices = distractors + [target]
        rng.shuffle(choices)
        docs.append({"context": "\n".join(files[fi][i - n_ctx: i]) + "\n", "choices": choices,
                     "label": choices.index(target)})
    tdir = task_dir(out)
    tdir.mkdir(parents=True)
    (tdir / f"{TASK_NAME}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    shutil.copy(SHIPPED_TASKS / f"{TASK_NAME}.yaml", tdir / f"{TASK_NAME}.yaml")


def task_include_path(model_dir: Path, dest: Path) -> Path:
    """The model's tasks in `dest` with @DATA@ replaced by the absolute JSONL path.

    lm-eval resolves `data_files` against the CWD, so a task file must name its data absolutely. The YAML is the
    shipped one (a model built before a task's metric_list changed follows the change); the data, the model's.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for yaml in task_dir(model_dir).glob("*.yaml"):
        data = (yaml.parent / f"{yaml.stem}.jsonl").resolve()
        text = (SHIPPED_TASKS / yaml.name).read_text()
        write_atomic(dest / yaml.name, text.replace("@DATA@", str(data)))   # another sweep may read it
    return dest
