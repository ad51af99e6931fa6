"""The code's shape, checked on every run: packages stack in layers and import only downwards (README's package
map), no import cycles, no module reaches into another's private names, and every module reads in one sitting.
Imports inside functions and the modules `import_module` names (a literal or an f-string's fixed part) count
as imports: a lazy import still runs."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("experiments", "optimizers")
MAX_LINES = 400
# Bottom to top: a module may import its own layer's modules and any layer below, never one above.
LAYERS = ("experiments.core", "experiments.analyse", "experiments.judge", "experiments.targets",
          "experiments.serving", "experiments.measure", "experiments.record", "optimizers", "experiments.climb",
          "experiments.cli", "experiments.tools", "experiments.benchmarks")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, known: set[str]):
    """(module imported, names taken from it), for the project's own modules only."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "import_module":
            yield from ((m, []) for m in _named_modules(node, name, known))
        if isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    yield f"{base}.{a.name}", []
                elif base in known:
                    yield base, [a.name]


def _named_modules(call: ast.Call, name: str, known: set[str]):
    """The project modules an import_module call can load: a literal names one; an f-string (the kinds'
    f"{__name__}.{kind}") any module under its fixed prefix."""
    arg = call.args[0] if call.args else None
    if isinstance(arg, ast.Constant) and arg.value in known:
        yield arg.value
    elif isinstance(arg, ast.JoinedStr):
        prefix = "".join(v.value if isinstance(v, ast.Constant) else (name if ast.unparse(v.value) == "__name__"
                                                                        else "\0") for v in arg.values)
        prefix = prefix.split("\0")[0]
        yield from (m for m in known if prefix and m.startswith(prefix) and m != name)


def layer_of(module: str) -> int:
    """The index of the module's layer in LAYERS; -1 for a package's own __init__ above the layers."""
    found = [i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + ".")]
    return found[0] if found else -1


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports that point from a lower layer up to a higher one."""
    return sorted(f"{a} ({LAYERS[layer_of(a)]}) imports {b} ({LAYERS[layer_of(b)]})"
                  for a, targets in edges.items() for b in targets if layer_of(b) > layer_of(a) >= 0)


def _graph():
    modules = _modules()
    edges, private = {}, []
    for name, path in modules.items():
        edges[name] = set()
        for target, names in _imports(name, path, set(modules)):
            if target != name:
                edges[name].add(target)
            private += [f"{name} takes {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    return modules, edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                component.append(w)
            on_stack.discard(v)
            if component:
                found.append(sorted(component + [v]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    _, edges, _ = _graph()
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_sits_in_a_layer():
    modules, _, _ = _graph()
    outside = [m for m in modules if layer_of(m) < 0 and m not in ("experiments", "optimizers")]
    assert outside == []


def test_imports_point_down_the_layers():
    _, edges, _ = _graph()
    assert upward(edges) == []


def test_the_layer_check_sees_an_upward_import_even_inside_a_function(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    from experiments.climb import rung\n")
    found = set(m for m, _ in _imports("experiments.core.m", tmp_path / "m.py", {"experiments.climb.rung"}))
    assert upward({"experiments.core.m": found}) == [
        "experiments.core.m (experiments.core) imports experiments.climb.rung (experiments.climb)"]


def test_the_layer_check_reads_import_module_targets(tmp_path):
    (tmp_path / "k.py").write_text("from importlib import import_module\n"
                                   "def kind(n):\n    return import_module(f'{__name__}.{n}')\n")
    known = {"experiments.targets.kinds.a", "experiments.targets.kinds.b", "experiments.judge.gate"}
    found = sorted(m for m, _ in _imports("experiments.targets.kinds", tmp_path / "k.py", known))
    assert found == ["experiments.targets.kinds.a", "experiments.targets.kinds.b"]


def test_only_the_record_layer_talks_to_mlflow():
    """The climb hands results to experiments/record, which logs them: MLflow is imported nowhere else in the
    product (developer tools and benchmarks aside)."""
    tools = ("experiments.record", "experiments.tools", "experiments.benchmarks")
    found = []
    for name, path in _modules().items():
        if name.startswith(tools):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{name} imports {n}" for n in names if n.split(".")[0] == "mlflow"]
    assert found == []


def test_no_module_imports_another_modules_private_names():
    _, _, private = _graph()
    assert private == []


def test_every_module_is_at_most_400_lines():
    modules, _, _ = _graph()
    long = {str(p.relative_to(ROOT)): n for p in modules.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


# --- imports at the top; inside a function only with its reason ------------------------------------------
REASONS = ("heavy", "optional", "start-up")
# Seconds to import each, and hundreds of MB: loaded by the function that uses them (`# heavy`), so that
# importing the climb, the CLI, every engine class, kind and optimizer (what a sweep's parent process does
# before it refuses bad input) loads none of them.
HEAVY = ("transformers", "tokenizers", "onnxruntime", "onnxruntime_genai", "onnx", "openvino", "nncf", "datasets",
         "gguf", "sqlalchemy", "torch_tensorrt", "torchao", "pynvml", "lm_eval.evaluator", "lm_eval.tasks",
         "lm_eval.models", "lm_eval.api.registry")
# What `roi-ladder --help`, `status` and a refused override must answer without (`# start-up`).
START_UP_FREE = ("torch", "mlflow", "hydra", "lm_eval", "matplotlib") + HEAVY


def function_imports(path: Path):
    """(line number, line) of every import inside a function."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines), str(path))
    for func in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(func):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node.lineno, lines[node.lineno - 1]


def test_an_import_inside_a_function_says_why():
    """At the top unless there is a reason, and the reason is written: `# heavy` (a library of seconds that
    only this function needs), `# optional` (a package that may be absent: the GPU extras), `# start-up`
    (the CLI's commands, each loading what it runs)."""
    silent = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in _modules().values()
              for n, line in set(function_imports(path))
              if line.partition("#")[2].strip().split(";")[0].strip() not in REASONS]
    assert silent == []


def _loaded_by(code: str, names: tuple[str, ...]) -> list[str]:
    code += f"\nimport sys; print(sorted(set(sys.modules) & {set(names)!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_heavy_imports_wait_for_the_function_that_needs_them():
    """What the `# heavy` comments claim: the sweep's own modules, every engine class, kind and optimizer
    import without loading them."""
    code = ("import importlib, pkgutil\nimport experiments.cli, experiments.climb.ladder, experiments.climb.endpoint\n"
            "import experiments.serving.backends as b, experiments.targets.kinds as k, optimizers as o\n"
            "for pkg in (b, k, o):\n"
            "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
            "        importlib.import_module(m.name)\n")
    assert _loaded_by(code, HEAVY) == []


def test_the_cli_starts_without_the_libraries_its_commands_load():
    assert _loaded_by("import experiments.cli", START_UP_FREE) == []
