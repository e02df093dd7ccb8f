"""A pytest plugin beside nbval (`-p lib.compendium.nbval_record --nbval-executed=PATH`): nbval executes a
notebook one cell per test and keeps no executed notebook; this writes one to PATH, as papermill would, with each
cell's outputs, execution count and duration (metadata.papermill), and in the notebook's metadata what nbval
checked: {"cells", "checked", "failed", "failure": {"cell", "first_line", "message", "timed_out"}}."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from lib.compendium.artifacts import write_text

_RECORDS: dict[int, dict] = {}
_FAILURE: dict = {}


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _plain(text: str) -> str:
    """Text without the terminal colours IPython and pytest put in tracebacks."""
    return _ANSI.sub("", text)


def pytest_addoption(parser):
    parser.addoption("--nbval-executed", default=None, help="write the executed notebook here (lib.compendium.nbval_record)")


def _is_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    t0 = time.time()
    yield
    if _is_cell(item):
        _RECORDS[item.cell_num] = {"outputs": list(item.test_outputs or []), "seconds": time.time() - t0,
                                   "checked": bool(item.options.get("check")) and item.cell.execution_count is not None}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if _is_cell(item) and rep.when == "call":
        rec = _RECORDS.setdefault(item.cell_num, {"outputs": list(item.test_outputs or []), "seconds": rep.duration,
                                                  "checked": bool(item.options.get("check")) and item.cell.execution_count is not None})
        rec["passed"] = rep.passed
        if rep.failed and not _FAILURE:
            text = str(rep.longrepr)
            first = next((ln for ln in item.cell.source.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
            exc = getattr(call.excinfo, "value", None)
            message = _plain(str(exc) if exc is not None else text)
            errors = [o for o in (item.test_outputs or []) if o.get("output_type") == "error"]
            if "Cell outputs differ" in text:
                message = "its output differs from the recorded one (tests/reference/ci_checked_outputs.json):\n" + \
                          _plain(text[text.find("Cell outputs differ"):])[:3000]
            elif errors:
                e = errors[-1]
                tb = _plain("\n".join(e.get("traceback", []))).splitlines()
                message = f"{e.get('ename')}: {e.get('evalue')}\n" + "\n".join(tb[-25:])
            _FAILURE.update({"code_cell": item.cell_num, "first_line": first[:80], "message": message,
                             "timed_out": "Timeout of" in message or "Timeout of" in text})


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--nbval-executed")
    if not path:
        return
    import nbformat
    files = [a for a in session.config.args if a.endswith(".ipynb")]
    if len(files) != 1:
        return
    nb = nbformat.read(files[0], as_version=4)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    count = 0
    for k, i in enumerate(code):
        cell, rec = nb.cells[i], _RECORDS.get(k)
        cell.outputs, cell.execution_count = [], None
        if rec is None:
            continue
        count += 1
        outs = []
        for o in rec["outputs"]:
            o = dict(o)
            if o.get("output_type") == "execute_result":
                o["execution_count"] = count
            outs.append(nbformat.from_dict(o))
        cell.outputs, cell.execution_count = outs, count
        cell.metadata["papermill"] = {"duration": round(rec["seconds"], 3),
                                      "status": "completed" if rec.get("passed", True) else "failed"}
    failure = dict(_FAILURE)
    if failure:
        failure["cell"] = code[failure.pop("code_cell")]
    nb.metadata["nbval"] = {"cells": sum(1 for r in _RECORDS.values() if r.get("passed")),
                            "checked": sum(1 for r in _RECORDS.values() if r.get("passed") and r["checked"]),
                            "failed": sum(1 for r in _RECORDS.values() if r.get("passed") is False),
                            **({"failure": failure} if failure else {})}
    write_text(Path(path), nbformat.writes(nb) + "\n")
