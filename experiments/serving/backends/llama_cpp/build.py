"""llama.cpp compiled once per machine from the sources PyPI carries, and a target's GGUF files made with it.

PyPI has no llama.cpp binary; the sdist of llama-cpp-python vendors llama.cpp's sources, and cmake, g++ and ninja
are on these machines. Its own Python server is unfit to measure (one request at a time, no token-id prompts, and
it cuts a stream to one token when another request waits), so the native `llama-server` is built, with
`llama-quantize`, and the sources' `convert_hf_to_gguf.py` and `gguf-py` are kept beside them to convert a Hugging
Face folder. ~10 min on 2 cores, once: the folder sits in the engines' cache (environments.engines_home).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments.serving.environments import EngineUnavailable, Step, engines_home, made_once

SOURCE = "llama-cpp-python==0.3.36"       # vendors llama.cpp; its version names the build
# static: the binaries are moved out of the build tree, whose shared libraries they would otherwise look for.
# No AMX: on a virtualised Xeon whose CPUID advertises it (Firecracker, 7 Dec 2026), -march=native compiled ggml's
# AMX kernels and every llama-server died of a general protection fault at their first ldtilecfg, for any model;
# without them ggml runs its AVX-512 VNNI kernels (gcc keeps an explicit -mno-* over what -march=native implies).
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")
TARGETS = ("llama-server", "llama-quantize")
# What the compile needs on the PATH: a tool, and the executables any of which is it
TOOLS = {"cmake": ("cmake",), "ninja": ("ninja",), "a C++ compiler": ("c++", "g++", "clang++")}
CONVERTER_PACKAGES = ("conversion", "gguf-py")    # what convert_hf_to_gguf.py imports beside it


@dataclass(frozen=True)
class LlamaCppBuild:
    source: str = SOURCE
    device: str = "cpu"

    @property
    def version(self) -> str:
        return self.source.split("==")[1]

    def folder(self, home: Path | None = None) -> Path:
        # GGML_NATIVE compiles for this CPU's instruction set: the folder is this machine's
        spec = hashlib.sha256(" ".join((*CMAKE_FLAGS, *TARGETS)).encode()).hexdigest()[:8]
        return (home or engines_home()) / f"llama.cpp-{self.version}-{self.device}-native-{spec}"

    def unbuildable(self, home: Path | None = None) -> str | None:
        """Why llama.cpp can be neither found built nor compiled here (the tools it lacks), or None."""
        if (self.folder(home) / "roi-engine.json").is_file():
            return None
        missing = [tool for tool, names in TOOLS.items() if not any(shutil.which(n) for n in names)]
        if not missing:
            return None
        return (f"llama.cpp is not built on this machine and compiling it needs {', '.join(missing)}, not found on "
                f"the PATH: install them (Debian/Ubuntu: apt install cmake g++ ninja-build; or pip install cmake "
                f"ninja), see docs/serving.md")

    def ensure(self, home: Path | None = None, note=print) -> Path:
        """The build's folder: bin/llama-server, bin/llama-quantize, convert_hf_to_gguf.py, gguf-py/."""
        if reason := self.unbuildable(home):
            raise EngineUnavailable(reason)
        return made_once(self.folder(home), self._build, f"llama.cpp {self.version} (llama-server, compiled for "
                         f"this CPU, ~10 min on 2 cores)", note)

    def _build(self, tmp: Path, step: Step) -> dict:
        with tempfile.TemporaryDirectory() as work:
            work = Path(work)
            step.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(work),
                      self.source], what=f"pip could not fetch the sources ({self.source}) from the registry")
            (archive,) = work.glob("*.tar.gz")
            with tarfile.open(archive) as tar:
                tar.extractall(work, filter="data")
            (root,) = (p for p in work.iterdir() if p.is_dir())
            sources = root / "vendor" / "llama.cpp"
            step.run(["cmake", "-B", str(work / "b"), "-G", "Ninja", *CMAKE_FLAGS], cwd=sources)
            step.run(["cmake", "--build", str(work / "b"), "--target", *TARGETS, "-j", str(os.cpu_count() or 1)],
                     cwd=sources)
            (tmp / "bin").mkdir()
            for target in TARGETS:
                shutil.copy2(work / "b" / "bin" / target, tmp / "bin" / target)
            shutil.copy2(sources / "convert_hf_to_gguf.py", tmp / "convert_hf_to_gguf.py")
            for package in CONVERTER_PACKAGES:
                shutil.copytree(sources / package, tmp / package)
        step.run([str(tmp / "bin" / "llama-server"), "--version"],
                 what="llama-server was built, but does not run")
        return asdict(self)


def gguf_of(build: Path, model_dir: Path, out: Path, kind: str, step: Step) -> None:
    """`model_dir` (a Hugging Face folder) as a GGUF file of `kind` (f32, bf16, f16 as converted; Q8_0, Q4_K_M
    quantized from the f32 file by llama-quantize) at `out`."""
    converted = out if kind in ("f32", "bf16", "f16") else out.with_suffix(".f32.gguf")
    step.run([sys.executable, str(build / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(converted),
              "--outtype", kind if converted == out else "f32"],
             what=f"llama.cpp's convert_hf_to_gguf.py refused {model_dir}",
             env={"PYTHONPATH": str(build / "gguf-py")})      # the converter's own gguf-py, not ours
    if converted != out:
        step.run([str(build / "bin" / "llama-quantize"), str(converted), str(out), kind],
                 what=f"llama-quantize could not make {kind}")
        converted.unlink()


def tokens_beyond_embedding(model_dir: Path) -> list[tuple[int, str]]:
    """(id, text) of the tokens `model_dir`'s tokenizer.json lists at ids the model's embedding has no row for
    (config.json's vocab_size): llama.cpp's convert_hf_to_gguf.py asserts there are none (transformers' GGUF
    loader writes such folders). Read from the files, cheaply; [] where either is missing."""
    config, tokenizer = Path(model_dir) / "config.json", Path(model_dir) / "tokenizer.json"
    if not config.is_file() or not tokenizer.is_file():
        return []
    vocab_size = json.loads(config.read_text()).get("vocab_size")
    if not isinstance(vocab_size, int):
        return []
    spec = json.loads(tokenizer.read_text())
    vocab = (spec.get("model") or {}).get("vocab")
    listed = {int(i): str(t) for t, i in vocab.items()} if isinstance(vocab, dict) else {}
    listed.update({int(t["id"]): str(t.get("content", "")) for t in spec.get("added_tokens") or []})
    return sorted((i, t) for i, t in listed.items() if i >= vocab_size)


def beyond_embedding_refusal(model_dir: Path) -> str | None:
    """Why llama.cpp's converter cannot make a GGUF of `model_dir` (tokens beyond the embedding), or None."""
    beyond = tokens_beyond_embedding(model_dir)
    if not beyond:
        return None
    vocab_size = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    shown = ", ".join(f"{i} {t!r}" for i, t in beyond[:5]) + (" …" if len(beyond) > 5 else "")
    return (f"the tokenizer lists {len(beyond)} token(s) beyond the model's embedding (ids >= vocab_size "
            f"{vocab_size}: {shown}), which llama.cpp's convert_hf_to_gguf.py refuses; drop them from "
            f"tokenizer.json's added_tokens and tokenizer_config.json's added_tokens_decoder (the model can never "
            f"produce them)")
