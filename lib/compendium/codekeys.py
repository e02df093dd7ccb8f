"""Code digests: what a stage's stamp and every cached trained artifact's key hold for the code behind them, the
definitions of its modules (or of named functions and what they reach), independent of formatting, comments,
docstrings, imports and where the code sits (re-exported by lib.compendium.artifacts)."""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any, Sequence

from lib import ROOT


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


def _strip_docstring(node: ast.AST) -> ast.AST:
    body = getattr(node, "body", None)
    if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
        node.body = body[1:] or [ast.Pass()]
    return node


def _definitions(text: str) -> list[str]:
    """A module's top-level definitions and statements as dumps, without imports, docstrings, comments,
    formatting or a `__main__` guard."""
    parts = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_main_guard(node):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue                                 # the module docstring, or a string on its own
        for sub in ast.walk(node):
            _strip_docstring(sub)
        parts.append(ast.dump(node, annotate_fields=False))
    return parts


def code_digest(*modules: Any) -> str:
    """What the code of `modules` computes, independent of where it sits: a digest of their top-level
    definitions and statements (sorted), without imports, docstrings, comments, formatting or a
    `__main__` guard. A model or dataset cached under it is rebuilt when a rule changes, not when
    code moves between files, gets a comment or imports from a new place (a digest of the file's
    bytes rebuilt the world and retrained every model for a moved `__main__` guard)."""
    return _digest_parts([p for mod in modules for p in _definitions(Path(mod.__file__).read_text(encoding="utf-8"))])


def _digest_parts(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()


#: the repository whose lib/ `code_of` reads (a test points it at a scratch copy to see what an edit rebuilds)
CODE_ROOT: list[Path] = [ROOT]


def module_file(name: str, root: Path | None = None) -> Path:
    """The file of lib module `name` ("lib.trace.model") under `root` (default CODE_ROOT)."""
    base = (root or CODE_ROOT[-1]).joinpath(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _top_level_names(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _definitions_of(text: str, wanted: Sequence[str], where: str) -> list[str]:
    """The dumps of a module's top-level definitions named in `wanted` and of every top-level definition of the same
    module they reach by name, transitively (a function, the helpers and constants it calls)."""
    body = [n for n in ast.parse(text).body if not isinstance(n, (ast.Import, ast.ImportFrom)) and not _is_main_guard(n)]
    by_name = {name: node for node in body for name in _top_level_names(node)}
    missing = [w for w in wanted if w not in by_name]
    if missing:
        raise FileNotFoundError(f"code_of: {where} defines no {', '.join(missing)}")
    seen: dict[int, ast.AST] = {}
    todo = [by_name[w] for w in wanted]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        todo += [by_name[n.id] for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in by_name]
    parts = []
    for node in seen.values():
        for sub in ast.walk(node):
            _strip_docstring(sub)
        parts.append(ast.dump(node, annotate_fields=False))
    return parts


def code_of(*names: str, root: Path | None = None) -> str:
    """`code_digest` of lib modules named by their dotted names, read from their files (under CODE_ROOT): the key
    every cached trained artifact carries for the code that trains it, so a changed rule retrains exactly the
    artifacts whose training modules it is in (16 hex digits). "module:f,g" takes only the definitions f and g of
    the module and what they reach in it by name (the metric functions a training run calls, not the whole file)."""
    parts = []
    for n in names:
        module, _, only = n.partition(":")
        f = module_file(module, root)
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as e:
            raise FileNotFoundError(f"code_of: no module {module} ({f}): {e.strerror or e}") from None
        parts += (_definitions_of(text, [x.strip() for x in only.split(",") if x.strip()], module) if only
                  else _definitions(text))
    return _digest_parts(parts)[:16]


def source_digest(path: Path | str) -> str:
    """The definitions' digest of one Python file (its bytes' digest when it does not parse)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return _digest_parts(_definitions(text))[:16]
    except SyntaxError:
        return hashlib.sha256(text.encode()).hexdigest()[:16]
