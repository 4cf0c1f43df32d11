"""The package's shape: a light frontend, no import cycles, layers that only import down,
and no class, function or C file too long to read in one sitting.

All of it is read from the source (an ast walk over radixlm/), so it runs in milliseconds and
fails with the names to fix.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "radixlm"

# Layers from the top down: a module may import its own layer's modules and any below it.
# lang and server sit side by side; neither imports the other.
LAYERS: list[tuple[str, ...]] = [
    ("radixlm.cli", "radixlm.launch_server", "radixlm.chat", "radixlm"),
    ("radixlm.lang", "radixlm.server"),
    ("radixlm.runtime",),
    ("radixlm.constraints", "radixlm.native", "radixlm.kernels", "radixlm.formats"),
    ("radixlm.radix",),
    ("radixlm.envs", "radixlm.hostinfo"),
]
MAX_METHODS = 25
MAX_SCHEDULER_METHODS = 15
MAX_FUNCTION_LINES = 60
MAX_C_LINES = 800


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every import statement, at any depth, except under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports (a `from pkg import mod` counts as `pkg.mod`)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_init_edges(name: str, target: str) -> bool:
    """A package's __init__ re-exporting its own submodules is not a cycle of files."""
    return target.startswith(name + ".")


def test_no_import_cycles():
    graph = import_graph()
    # `pkg/__init__.py` importing `pkg.sub` while `pkg.sub` imports a sibling via `pkg` is
    # fine; an edge from a submodule up to its own package's __init__ is not followed.
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    assert find_cycles(graph) == []


def layer_of(module: str) -> int:
    best, depth = -1, -1
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = i, len(prefix)
    return best


def test_layers_import_only_down():
    """No arrow runs up a layer, and the two siblings of one layer (lang, server) do not
    import each other."""
    wrong = []
    for module, targets in import_graph().items():
        mine = layer_of(module)
        for target in targets:
            theirs = layer_of(target)
            sibling = theirs == mine and len(LAYERS[mine]) > 1 and top(module) != top(target)
            if theirs < mine or (sibling and mine == 1):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def top(module: str) -> str:
    return ".".join(module.split(".")[:2])


LIGHT = ("torch", "numpy", "outlines_core", "llguidance")


@pytest.mark.parametrize("statement", ["import radixlm.lang", "import radixlm",
                                       "import radixlm as sgl; sgl.RuntimeEndpoint"])
def test_frontend_import_is_light(statement):
    code = (f"import sys; {statement}; "
            f"print(sorted(m for m in {LIGHT!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PKG.parent)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("module", ["radixlm.runtime.engine", "radixlm.server.app",
                                    "radixlm.cli"])
def test_runtime_and_server_load_no_dsl_module(module):
    """The engine and server processes do not load the frontend language."""
    code = (f"import sys; import {module}; "
            "print(sorted(m for m in sys.modules if m.split('.')[:2] == ['radixlm', 'lang']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PKG.parent)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_engine_module_imports_no_torch():
    """Importing the engine imports no torch: ``Engine()`` imports the runtime after it has
    read the config and started its tokenizer's thread, which builds a GGUF's vocabulary
    meanwhile (``engine.runtime_classes``). The decoder's plan, the arena and the model's
    shape are torch-free too."""
    code = ("import sys; import radixlm.runtime.engine, radixlm.native.plan, "
            "radixlm.native.arena, radixlm.runtime.models.shape; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PKG.parent)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_constraints_do_not_import_the_formats():
    """Within their layer the formats sit above the constraints: a tool-call grammar or a
    template may use the constraint builders, never the other way round (one direction, no
    cycle through the sibling)."""
    graph = import_graph()
    upward = sorted(f"{name} -> {target}" for name, targets in graph.items()
                    if name.startswith("radixlm.constraints") for target in targets
                    if target.startswith("radixlm.formats"))
    assert not upward, upward
    assert any(t.startswith("radixlm.constraints") for name, targets in graph.items()
               if name.startswith("radixlm.formats") for t in targets)  # (the direction used)


def test_formats_load_no_torch_runtime_server_or_dsl():
    """The formats (tool-call parsers, chat templates) are plain Python below the runtime."""
    code = ("import sys; import radixlm.formats.tool_parsers, radixlm.formats.chat_templates; "
            "print(sorted(m for m in sys.modules if m == 'torch' or "
            "m.split('.')[:2] in (['radixlm', 'runtime'], ['radixlm', 'server'], "
            "['radixlm', 'lang'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PKG.parent)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_package_gives_every_dsl_name():
    import radixlm
    import radixlm.lang

    assert sorted(radixlm._LANG_NAMES) == sorted(radixlm.lang.__all__)
    assert all(getattr(radixlm, n) is getattr(radixlm.lang, n) for n in radixlm.lang.__all__)


def _classes_and_functions():
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            yield path, node


def test_no_class_over_25_methods():
    big = []
    for path, node in _classes_and_functions():
        if isinstance(node, ast.ClassDef):
            n = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
            limit = MAX_SCHEDULER_METHODS if node.name == "Scheduler" else MAX_METHODS
            if n > limit:
                big.append(f"{path.relative_to(PKG)}:{node.name} has {n} methods")
    assert big == []


def test_no_function_over_60_lines():
    long = []
    for path, node in _classes_and_functions():
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(PKG)}:{node.name} is {n} lines")
    assert long == []


def test_no_c_file_over_800_lines():
    long = [f"{p.relative_to(PKG)} is {n} lines"
            for p in sorted(PKG.rglob("*.[ch]"))
            if (n := len(p.read_text().splitlines())) > MAX_C_LINES]
    assert long == []


def test_cycle_finder_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


ROOT = PKG.parent
HISTORY = re.compile(r"\bsessions?\s+\d|\bat (the )?session start|\bbefore this change|"
                     r"\bwork period", re.I)


def test_readme_is_short_and_docs_carry_no_history():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted(PKG.rglob("README.md"))]
    diary = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in pages
             for i, line in enumerate(p.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert diary == []
