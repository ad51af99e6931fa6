"""Knowledge distillation: a shallower student of the same architecture, taught by the champion's model.

The student is the teacher's config with fewer decoder layers. It starts from the teacher's own weights
(embeddings, final norm, lm_head, and an evenly spaced subset of its decoder layers), then learns on windows
of the target's training text from the teacher's temperature-softened next-token distributions (Hinton et al.:
KL * T^2), mixed with the plain next-token cross-entropy. It is saved as a Hugging Face folder that every
engine loads like any other model, under `<cache_dir>/students/<content hash>`, so an unchanged rerun
reuses it.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from experiments.core.cache import build_once
from experiments.targets.models.tiny_llm import adamw_warmup_cosine

log = logging.getLogger(__name__)

DISTILL_FORMAT = 1   # bump when the code changes what the same settings produce
RECORDS = ("manifest.json", "build.json", "distill.json")   # about a folder's build, not the model in it
# Teacher files the student does not inherit as they are: it gets its own config, weights and records.
NOT_COPIED = ("config.json", *RECORDS)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".index.json")


@dataclass(frozen=True)
class DistillSettings:
    student_layers: int
    steps: int
    seq_len: int          # tokens per training window
    batch_size: int
    lr: float
    temperature: float    # softens both distributions: the teacher's ranking of wrong tokens is what it teaches
    alpha: float          # weight of the KD term; 1 - alpha goes to next-token cross-entropy on the text
    seed: int

    def __post_init__(self):
        problems = [what for what, bad in (
            ("student_layers >= 1", self.student_layers < 1), ("steps >= 1", self.steps < 1),
            ("seq_len >= 2", self.seq_len < 2), ("batch_size >= 1", self.batch_size < 1),
            ("lr > 0", self.lr <= 0), ("temperature > 0", self.temperature <= 0),
            ("0 <= alpha <= 1", not 0 <= self.alpha <= 1)) if bad]
        if problems:
            raise ValueError(f"distillation settings need {', '.join(problems)} (got {self})")


@dataclass(frozen=True)
class DistillResult:
    path: Path
    reused: bool
    seconds: float                 # this call: training, or only the cache check when reused
    train_seconds: float           # what building the student took, when it was built
    teacher_layers: int
    kept_layers: tuple[int, ...]   # the teacher's decoder layers the student started from, in order
    parameters: int
    teacher_parameters: int
    train_tokens: int              # the training text's length in the teacher's tokens (windows are drawn from it)
    final_kd_loss: float           # moving averages over the last steps
    final_ce_loss: float


def kept_layers(teacher_layers: int, student_layers: int) -> tuple[int, ...]:
    """Evenly spaced teacher layers, always including the first and the last.

    The last layer's output is what the final norm and lm_head were trained to read, and the first layer is
    the one trained to read the embeddings; keeping both leaves the student's two interfaces intact, so it
    starts close to the teacher and training only has to bridge the removed middle.
    """
    if not 1 <= student_layers < teacher_layers:
        raise ValueError(f"a student needs 1..{teacher_layers - 1} layers (the teacher has {teacher_layers}), "
                         f"got {student_layers}")
    if student_layers == 1:
        return (teacher_layers - 1,)
    step = (teacher_layers - 1) / (student_layers - 1)
    return tuple(round(i * step) for i in range(student_layers))


def distill(teacher_dir: Path, texts: list[str], settings: DistillSettings, cache_dir: Path, threads: int = 1,
            progress: Callable[[str], None] = log.info,
            on_step: Callable[[int, int], None] | None = None) -> DistillResult:
    """The student folder for (teacher, texts, settings): built here, or reused from the cache; on_step(done,
    total) after each training step."""
    started = time.perf_counter()
    teacher_dir = Path(teacher_dir)
    key = student_key(teacher_dir, texts, settings)
    out = Path(cache_dir) / "students" / f"student-{settings.student_layers}L-{key}"
    record = {}

    def build(tmp: Path) -> None:
        record.update(_build(teacher_dir, texts, settings, threads, progress, tmp, on_step))
        record["train_seconds"] = round(time.perf_counter() - started, 2)
        (tmp / "distill.json").write_text(json.dumps(record, indent=2))

    if build_once(out, build, "cached student", progress):
        return _result(out, reused=True, seconds=time.perf_counter() - started)
    progress(f"distilled a {settings.student_layers}-layer student in {record['train_seconds']} s "
             f"(KD loss {record['final_kd_loss']:.3f}, CE {record['final_ce_loss']:.3f})")
    return _result(out, reused=False, seconds=time.perf_counter() - started)


def student_key(teacher_dir: Path, texts: list[str], settings: DistillSettings) -> str:
    import tokenizers  # heavy
    import transformers  # heavy

    texts_digest = hashlib.sha256()
    for t in texts:
        texts_digest.update(hashlib.sha256(t.encode("utf-8", "replace")).digest())
    blob = json.dumps({"format": DISTILL_FORMAT, "teacher": _folder_digest(teacher_dir),
                       "texts": texts_digest.hexdigest(), "settings": asdict(settings), "torch": torch.__version__,
                       "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _folder_digest(folder: Path) -> str:
    """The teacher's content (config, weights, tokenizer), not its path: a rebuilt identical teacher matches."""
    digest = hashlib.sha256()
    for p in sorted(q for q in folder.iterdir() if q.is_file() and q.name not in RECORDS):
        digest.update(p.name.encode())
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _result(folder: Path, reused: bool, seconds: float) -> DistillResult:
    r = json.loads((folder / "distill.json").read_text())
    return DistillResult(path=folder, reused=reused, seconds=seconds, train_seconds=r["train_seconds"],
                         teacher_layers=r["teacher_layers"], kept_layers=tuple(r["kept_layers"]),
                         parameters=r["parameters"], teacher_parameters=r["teacher_parameters"],
                         train_tokens=r["train_tokens"],
                         final_kd_loss=r["final_kd_loss"], final_ce_loss=r["final_ce_loss"])


# --- the student ----------------------------------------------------------------------------------------
def decoder_layers(model):
    """(dotted name, ModuleList) of the model's decoder layers: the ModuleList as long as the layer count."""
    n = model.config.num_hidden_layers
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    if len(found) != 1:
        raise ValueError(f"cannot tell which ModuleList holds the {n} decoder layers of "
                         f"{type(model).__name__} (candidates: {[name for name, _ in found]})")
    return found[0]


def init_student(teacher, student_layers: int):
    """The teacher's architecture with `student_layers` decoder layers, each a copy of a kept teacher layer."""
    from transformers import AutoModelForCausalLM  # heavy

    keep = kept_layers(teacher.config.num_hidden_layers, student_layers)
    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = student_layers
    if isinstance(getattr(config, "layer_types", None), list):   # per-layer attention kinds (sliding/full)
        config.layer_types = [config.layer_types[i] for i in keep]
    student = AutoModelForCausalLM.from_config(config, dtype=next(teacher.parameters()).dtype)
    prefix, _ = decoder_layers(teacher)
    renamed = {f"{prefix}.{i}.": f"{prefix}.{j}." for j, i in enumerate(keep)}
    state = {}
    for key, value in teacher.state_dict().items():
        if key.startswith(prefix + "."):
            layer = key[len(prefix) + 1:].split(".", 1)[0]
            old = f"{prefix}.{layer}."
            if old not in renamed:
                continue
            key = renamed[old] + key[len(old):]
        state[key] = value.clone()
    student.load_state_dict(state, strict=True)
    student.generation_config = copy.deepcopy(teacher.generation_config)
    return student, keep


def _build(teacher_dir: Path, texts: list[str], s: DistillSettings, threads: int, progress, out: Path,
           on_step=None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(s.seed)
        tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
        teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32, use_safetensors=True).eval()
        student, keep = init_student(teacher, s.student_layers)
        progress(f"student: {s.student_layers} of the teacher's {teacher.config.num_hidden_layers} layers "
                 f"(from layers {list(keep)}); distilling {s.steps} steps")
        stream = token_stream(tokenizer, texts)
        kd, ce = _train(teacher, student, stream, s, progress, on_step)
        student.eval()
        student.save_pretrained(out, safe_serialization=True)
        for f in Path(teacher_dir).iterdir():
            # Tokenizer and generation files: engines load them from the model folder (the ORT builder too).
            if f.is_file() and f.name not in NOT_COPIED and not f.name.endswith(WEIGHT_SUFFIXES):
                shutil.copy2(f, out / f.name)
        return {"format": DISTILL_FORMAT, "teacher": str(teacher_dir), "settings": asdict(s),
                "teacher_layers": teacher.config.num_hidden_layers, "kept_layers": list(keep),
                "parameters": sum(p.numel() for p in student.parameters()),
                "teacher_parameters": sum(p.numel() for p in teacher.parameters()),
                "train_tokens": len(stream), "final_kd_loss": kd, "final_ce_loss": ce}
    finally:
        torch.set_num_threads(previous_threads)


def token_stream(tokenizer, texts: list[str]):
    """All texts tokenized with the teacher's tokenizer, one stream, documents separated by EOS."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        ids.extend(eos)
    return torch.tensor(ids, dtype=torch.long)


def kd_loss(student_logits, teacher_logits, input_ids, temperature: float, alpha: float):
    """(total, KD term, CE term): KL(teacher_T || student_T) * T^2 per position, and next-token CE."""
    vocab = student_logits.shape[-1]
    t = temperature
    kd = F.kl_div(F.log_softmax(student_logits.reshape(-1, vocab) / t, -1),
                  F.log_softmax(teacher_logits.reshape(-1, vocab) / t, -1),
                  log_target=True, reduction="batchmean") * t * t
    ce = F.cross_entropy(student_logits[:, :-1].reshape(-1, vocab), input_ids[:, 1:].reshape(-1))
    return alpha * kd + (1 - alpha) * ce, kd, ce


def _train(teacher, student, stream, s: DistillSettings, progress, on_step=None) -> tuple[float, float]:
    if len(stream) <= s.seq_len + 1:
        raise ValueError(f"training text has {len(stream)} tokens: too little for one window of {s.seq_len}")
    gen = torch.Generator().manual_seed(s.seed)
    opt, sched = adamw_warmup_cosine(student, s.lr, s.steps)
    student.train()
    kd_ema = ce_ema = None
    for step in range(s.steps):
        starts = torch.randint(0, len(stream) - s.seq_len, (s.batch_size,), generator=gen)
        batch = torch.stack([stream[i: i + s.seq_len] for i in starts.tolist()])
        with torch.no_grad():
            teacher_logits = teacher(input_ids=batch).logits
        loss, kd, ce = kd_loss(student(input_ids=batch).logits, teacher_logits, batch, s.temperature, s.alpha)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        kd_ema = kd.item() if kd_ema is None else 0.9 * kd_ema + 0.1 * kd.item()
        ce_ema = ce.item() if ce_ema is None else 0.9 * ce_ema + 0.1 * ce.item()
        if on_step:
            on_step(step + 1, s.steps)
        if (step + 1) % max(1, s.steps // 5) == 0:
            progress(f"distill step {step + 1}/{s.steps}: KD {kd_ema:.3f}, CE {ce_ema:.3f}")
    return float(kd_ema), float(ce_ema)


# --- how close the student is -----------------------------------------------------------------------------
def mean_kl(teacher, student, windows) -> float:
    """Mean KL(teacher || student) per position over token windows, in nats, at temperature 1."""
    total, positions = 0.0, 0
    with torch.no_grad():
        for w in windows:
            ids = torch.as_tensor(w, dtype=torch.long).reshape(1, -1)
            t = F.log_softmax(teacher(input_ids=ids).logits[0].float(), -1)
            q = F.log_softmax(student(input_ids=ids).logits[0].float(), -1)
            total += float((t.exp() * (t - q)).sum())
            positions += ids.shape[1]
    return total / positions
