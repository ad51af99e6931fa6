"""The code's shape, checked on every run: packages stack in layers and import only downwards (README's package
map), no import cycles, no module reaches into another's private names, and every module reads in one sitting.
Imports inside functions and the modules `import_module` names (a literal or an f-string's fixed part) count
as imports: a lazy import still runs."""
from __future__ import annotations

import ast
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
