"""What a stage's processes really used: the library modules they imported and the files they opened, recorded
from inside each process (so lazy imports, registry entries and files read by any library count, not what import
lines suggest).

`make reproduce` sets COMPENDIUM_USAGE_DIR for a stage; every process of it that imports `lib` (the notebook's
kernel, a python step, training workers, model servers) then installs `record` (an audit hook on `open`) and, when
it exits, writes one JSON file there: {"modules": {name: file}, "opened": [paths under the repository]}.
lib.compendium.stages turns the union into the stage's stamp: the modules' definitions, the prompt, schema and
preset files it read, and the contents of the other stages' outputs it read.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import uuid
from pathlib import Path

USAGE_ENV = "COMPENDIUM_USAGE_DIR"

_OPENED: set[str] = set()
_INSTALLED = False
_TOKEN = uuid.uuid4().hex[:8]           # one record file per process, however often it is rewritten
_KERNEL = False                          # this process is a notebook's kernel


def _hook(event: str, args: tuple) -> None:
    if event != "open":
        return
    try:
        path = args[0]
        if isinstance(path, int):
            return
        path = os.fsdecode(path)
        if not os.path.isabs(path):
            path = os.path.join(os.getcwd(), path)
        _OPENED.add(os.path.normpath(path))
    except Exception:  # noqa: BLE001 - an audit hook must never raise into the code it watches
        pass


def _write(root: str, out_dir: str) -> None:
    """Write (or rewrite) this process's record: one file per process, replaced atomically each time."""
    try:
        mods = {}
        for name, m in list(sys.modules.items()):
            f = getattr(m, "__file__", None)
            spec = getattr(m, "__spec__", None)
            if name == "__main__" and spec is not None:       # `python -m lib.x` runs lib.x as __main__
                name = spec.name
            if (name == "lib" or name.startswith("lib.")) and f:
                mods[name] = os.path.relpath(f, root)
        prefix = root.rstrip(os.sep) + os.sep
        opened = sorted(r for r in (os.path.relpath(p, root) for p in _OPENED if p.startswith(prefix))
                        if not r.startswith((".venv", ".git" + os.sep)) and "__pycache__" not in r)
        os.makedirs(out_dir, exist_ok=True)
        name = f"{os.getpid()}-{_TOKEN}.json"
        tmp = os.path.join(out_dir, f".{name}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"pid": os.getpid(), "argv": sys.argv[:3], "kernel": _KERNEL, "main": sys.modules.get("__main__").__spec__.name
                       if getattr(sys.modules.get("__main__"), "__spec__", None) else None,
                       "modules": mods, "opened": opened}, fh)
        os.replace(tmp, os.path.join(out_dir, name))
    except Exception:  # noqa: BLE001 - recording usage must never fail the process; a stage without a record
        pass            # counts as using every module and every earlier stage


def install(root: str | Path) -> None:
    """Record this process's usage for the stage named by COMPENDIUM_USAGE_DIR (no-op when it is unset)."""
    global _INSTALLED
    out = os.environ.get(USAGE_ENV)
    if not out or _INSTALLED:
        return
    _INSTALLED = True
    sys.addaudithook(_hook)
    atexit.register(_write, str(root), out)
    try:                                   # a multiprocessing worker leaves through os._exit: its finalizers run
        from multiprocessing import util   # lazy: only where a stage records its usage
        util.Finalize(None, _write, args=(str(root), out), exitpriority=-100)
    except Exception:  # noqa: BLE001
        pass
    try:                                   # a notebook's kernel may be stopped without running atexit: after every cell
        from IPython import get_ipython    # lazy: only inside a kernel
        ip = get_ipython()
        if ip is not None and type(ip).__name__ == "ZMQInteractiveShell":
            global _KERNEL
            _KERNEL = True
            ip.events.register("post_run_cell", lambda *_: _write(str(root), out))
    except Exception:  # noqa: BLE001
        pass


def collect(usage_dir: Path, main: str | None = None) -> dict[str, object] | None:
    """The union of a stage's usage records, or None when the stage's own process left none (a kernel stopped
    before its first cell ended, a process killed first): then nobody can say what it used. `main`: the module a
    python step runs (`python -m <main>`); None: a notebook, whose kernel must have written a record."""
    files = sorted(Path(usage_dir).glob("*.json")) if Path(usage_dir).exists() else []
    mods: dict[str, str] = {}
    opened: set[str] = set()
    found_main = False
    for f in files:
        try:
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found_main = found_main or (rec.get("main") == main if main else bool(rec.get("kernel")))
        mods.update(rec.get("modules", {}))
        opened.update(rec.get("opened", []))
    if not found_main:
        return None
    return {"modules": dict(sorted(mods.items())), "opened": sorted(opened)}
