"""The import graph of lib/: no cycle (counting imports inside functions too), and every import goes
down the layers lib/README.md draws, never back up."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib"

#: lib/README.md's layers, lowest first: a module may import its own layer and the ones below
LAYERS = {
    0: {"lib", "lib.artifacts", "lib.prompts", "lib.presets", "lib.metrics", "lib.plotting", "lib.envfiles",
        "lib.train_memory"},
    1: {"lib.datasets", "lib.render", "lib.injection", "lib.memeworld", "lib.data_prep"},
    2: {"lib.chat", "lib.encoders", "lib.serve", "lib.llm_adapt", "lib.memeworld_vlm", "lib.nli", "lib.textmetrics"},
    3: {"lib.captioning", "lib.trace", "lib.clip4dm", "lib.agents", "lib.sei", "lib.debate"},
    4: {"lib.trace_report", "lib.clip4dm_report", "lib.agents_report", "lib.sei_report", "lib.debate_report",
        "lib.embedded_models", "lib.serving", "lib.crosseval", "lib.figures", "lib.results", "lib.report",
        "lib.params", "lib.param_schemas", "lib.runner", "lib.costs", "lib.measure", "lib.smoke_models", "lib.recompute",
        "lib.nbcheck"},
}


#: third-party packages imported inside the functions that use them, on purpose (lib/README.md says
#: why: importing a lib module stays cheap where no model, plot or notebook machinery is needed)
LAZY_PACKAGES = {"torch", "transformers", "tokenizers", "safetensors", "open_clip", "sentence_transformers", "peft",
                 "accelerate", "xllamacpp", "gguf", "bert_score", "rouge_score", "vaderSentiment", "sklearn", "scipy",
                 "statsmodels", "pandas", "matplotlib", "seaborn", "IPython", "nbformat", "nbconvert", "papermill"}


def module_name(path: Path) -> str:
    rel = path.relative_to(LIB.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in LIB.rglob("*.py")}


def layer_of(mod: str) -> int:
    unit = mod if mod == "lib" else ".".join(mod.split(".")[:2])     # a package's files share its layer
    for n, members in LAYERS.items():
        if unit in members:
            return n
    raise AssertionError(f"{mod} is in no layer of tests/test_architecture.py (and lib/README.md)")


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(mod: str) -> set[str]:
    """The lib modules `mod` imports anywhere in its file (functions included, TYPE_CHECKING blocks not)."""
    path = MODULES[mod]
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    stack = [ast.parse(path.read_text(encoding="utf-8"))]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            stack.append(child)
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names]
            for n in names:
                while n and n not in MODULES:
                    n = n.rpartition(".")[0]
                if n and n != mod:
                    out.add(n)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


def test_no_import_cycle():
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(GRAPH[m]):
            if state.get(n) == 1:
                cycle = path[path.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def test_imports_never_run_back_up_the_layers():
    bad = [f"{m} (layer {layer_of(m)}) imports {n} (layer {layer_of(n)})"
           for m in sorted(GRAPH) for n in sorted(GRAPH[m])
           if layer_of(n) > layer_of(m) and not (m == "lib" or n.startswith(m + "."))]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_function_level_imports(tmp_path):
    # the graph counts an import inside a function (the way cycles used to hide)
    assert "lib.chat.registry" in GRAPH["lib.chat.captioned"]
    assert any("lib.chat" in GRAPH[m] for m in GRAPH if m.startswith("lib.sei"))


def test_one_metrics_module():
    # accuracy, F1, AP, bootstrap intervals and McNemar are computed in lib/metrics.py only, so every
    # method means the same thing by them (no F1 recomputed in a method file, no second bootstrap)
    pattern = re.compile(r"sklearn\.metrics|stats\.bootstrap|statsmodels|def bootstrap|def mcnemar|f1_score\(")
    bad = [f"{p.relative_to(LIB.parent)}:{i}" for p in sorted(LIB.rglob("*.py")) if p.name != "metrics.py"
           for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not bad, "metric code outside lib/metrics.py: " + ", ".join(bad)


def test_imports_sit_at_module_level_unless_lazy_on_purpose():
    # an import inside a function is either a heavy optional package (LAZY_PACKAGES) or carries its
    # reason on the line ("# lazy: ..."); lib and standard-library imports otherwise go to the top
    bad = []
    for mod, path in sorted(MODULES.items()):
        src = path.read_text(encoding="utf-8")
        lines = src.splitlines()
        for fn in ast.walk(ast.parse(src)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                roots = {a.name.split(".")[0] for a in node.names} if isinstance(node, ast.Import) \
                    else {(node.module or "").split(".")[0]}
                if roots <= LAZY_PACKAGES or "# lazy:" in lines[node.lineno - 1]:
                    continue
                bad.append(f"{path.relative_to(LIB.parent)}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "imports inside functions with no reason given:\n" + "\n".join(bad)
