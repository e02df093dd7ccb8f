"""The import graph of lib/: no cycle (counting imports inside functions too), and every import goes
down the layers lib/README.md draws, never back up."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib"

#: lib/README.md's layers, lowest first: a module may import its own layer and the ones below. The
#: folders group files by what they serve (a paper, data, models, evaluation, the compendium's machinery);
#: the layers order them by what they may import, so a folder can span layers (a paper's method sits
#: below its report). A name here is a module or a package whose files all share the layer; a module's
#: layer is that of the longest name that holds it.
LAYERS = {
    0: {"lib", "lib.compendium.codekeys", "lib.compendium.artifacts", "lib.compendium.prompts", "lib.compendium.presets",
        "lib.evaluation.plan", "lib.evaluation.verdicts", "lib.evaluation.plan_page",
        "lib.compendium.envfiles", "lib.compendium.numerics", "lib.compendium.procs", "lib.compendium.nbval_record",
        "lib.compendium.bookkeeping", "lib.compendium.sharding",
        "lib.compendium.usage", "lib.evaluation.metrics", "lib.evaluation.claims", "lib.evaluation.plotting", "lib.models.train_memory",
        "lib.compendium", "lib.data", "lib.evaluation", "lib.models", "lib.trace", "lib.clip4dm", "lib.sei",
        "lib.arcade"},     # the package files: a docstring each, no imports
    1: {"lib.data.datasets", "lib.data.render", "lib.data.injection", "lib.data.memeworld", "lib.data.memeworld_draw", "lib.data.memeworld_align",
        "lib.data.memeworld_files", "lib.data.records", "lib.data.readers", "lib.data.prep"},
    2: {"lib.models.chat", "lib.models.encoders", "lib.models.serve", "lib.models.llm_adapt",
        "lib.models.memeworld_vlm", "lib.models.nli", "lib.evaluation.textmetrics", "lib.sei.training_step"},
    3: {"lib.trace.captioning", "lib.trace.model", "lib.trace.features", "lib.trace.training", "lib.trace.probe",
        "lib.clip4dm.method", "lib.clip4dm.runs", "lib.clip4dm.claims",
        "lib.sei.agents", "lib.sei.fewshot", "lib.sei.retrieval", "lib.sei.adapt",
        "lib.arcade.court", "lib.arcade.oracle", "lib.arcade.scoring", "lib.arcade.adapt"},
    4: {"lib.trace.runs", "lib.trace.report", "lib.trace.controls", "lib.trace.interplay", "lib.trace.figures",
        "lib.clip4dm.report", "lib.clip4dm.figures",
        "lib.sei.agents_report", "lib.sei.report", "lib.sei.analysis", "lib.sei.figures",
        "lib.arcade.report", "lib.arcade.figures",
        "lib.data.figures", "lib.models.embedded", "lib.models.serving", "lib.models.smoke", "lib.models.figures",
        "lib.evaluation.crosseval", "lib.evaluation.figures", "lib.evaluation.figure_kit", "lib.evaluation.recompute", "lib.evaluation.preconditions",
        "lib.compendium.results", "lib.compendium.compare", "lib.compendium.findings", "lib.compendium.report", "lib.compendium.params", "lib.compendium.param_schemas",
        "lib.compendium.runner", "lib.compendium.stages", "lib.compendium.costs", "lib.compendium.measure", "lib.compendium.nbcheck",
        "lib.compendium.gpu_check",
        "lib.compendium.stamps", "lib.compendium.lab", "lib.compendium.scrub", "lib.compendium.inputs",
        "lib.compendium.timekeeping",
        "lib.compendium.outputs",
        "lib.compendium.execution"},
}
#: the largest a lib file may grow: past it, a file holds more than one concern
MAX_LINES = 600


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
#: the folders whose own name is in LAYERS only for their __init__ file (each module inside has its own entry)
PACKAGE_FILES = {"lib.compendium", "lib.data", "lib.evaluation", "lib.models", "lib.trace", "lib.clip4dm", "lib.sei",
                 "lib.arcade"}


def layer_of(mod: str) -> int:
    parts = mod.split(".")
    for k in range(len(parts), 0, -1):                   # the longest name that holds it
        unit = ".".join(parts[:k])
        for n, members in LAYERS.items():
            if unit in members and (unit != "lib" or mod == "lib") and (k == len(parts) or unit not in PACKAGE_FILES):
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
    assert "lib.models.chat.registry" in GRAPH["lib.models.chat.captioned"]
    assert any("lib.models.chat" in GRAPH[m] for m in GRAPH if m.startswith("lib.sei.fewshot"))


def test_one_metrics_module():
    # accuracy, F1, AP, bootstrap intervals and McNemar are computed in lib/evaluation/metrics.py only, so every
    # method means the same thing by them (no F1 recomputed in a method file, no second bootstrap)
    pattern = re.compile(r"sklearn\.metrics|stats\.bootstrap|statsmodels|def bootstrap|def mcnemar\b|f1_score\(")
    bad = [f"{p.relative_to(LIB.parent)}:{i}" for p in sorted(LIB.rglob("*.py")) if p.name != "metrics.py"
           for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not bad, "metric code outside lib/evaluation/metrics.py: " + ", ".join(bad)


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


def test_no_lib_file_over_the_size_limit():
    big = [f"{p.relative_to(LIB.parent)} ({n} lines)" for p in sorted(LIB.rglob("*.py"))
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not big, f"lib files over {MAX_LINES} lines: " + ", ".join(big)


def test_package_files_import_nothing():
    # a folder's __init__ is its docstring: importing lib.trace.report must not load the rest of TRACE
    for pkg in PACKAGE_FILES:
        assert not GRAPH[pkg], f"{pkg}/__init__.py imports {sorted(GRAPH[pkg])}"


def test_each_paper_has_its_folder():
    for paper, files in {"trace": ("captioning", "model", "report"), "clip4dm": ("method", "report"),
                         "sei": ("agents", "fewshot", "report"), "arcade": ("court", "report")}.items():
        for f in files:
            assert f"lib.{paper}.{f}" in MODULES, f"lib/{paper}/{f}.py is missing"


def test_figures_read_declared_artifacts_only():
    # a figure names the declared artifacts it reads (lib/compendium/artifacts.py: ARTIFACTS), never a path
    # of its own and never the parameter profile: a figure redrawn from results/ sees what the stage wrote
    figure_files = [p for p in LIB.rglob("*.py") if p.name in ("figures.py", "figure_kit.py")]
    assert len(figure_files) >= 8
    path_literal = re.compile(r"""["'](0[0-9]_[a-z0-9_]+|models|serving)/""")
    bad = [f"{p.relative_to(LIB.parent)}:{i}" for p in figure_files
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if path_literal.search(line) or "load_profile" in line or "compendium.params" in line]
    assert not bad, "figures reading a path or the profile: " + ", ".join(bad)


def test_every_figure_input_is_declared():
    from lib.compendium.artifacts import ARTIFACTS
    from lib.evaluation import figures
    for f in figures.REGISTRY.values():
        assert f.artifacts, f.name
        for name, _ in f.artifacts:
            assert name in ARTIFACTS, f"figure {f.name} reads {name!r}, which ARTIFACTS does not declare"
