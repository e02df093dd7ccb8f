"""How a stage's notebook is executed, and the time it may take: papermill (every profile but `ci`) or nbval
(`ci`, what `make test` runs: papermill prepares the notebook, nbval executes it once and compares the cells a
notebook marks `# NBVAL_CHECK_OUTPUT` with their recorded outputs), each under a per-cell timeout, and every
stage under a timeout of its own (lib.compendium.stages runs it).

The limits come from the profile's `runner` section (RunnerConfig); by default each is a stated multiple of the
time this stage (or its slowest cell) took in the runs recorded for the profile, or for the profile it extends
(timings.json, here or committed), never under a floor; a stage with no record gets `unrecorded_stage_s`.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lib import ROOT
from lib.compendium.artifacts import ARTIFACTS_ROOT, RESULTS_ROOT, read_json
from lib.compendium.params import ProfileError, RunnerConfig, _parent_and_own

#: the checked cells' recorded outputs at ci sizes (lib.compendium.nbcheck --write records them)
REFERENCE = ROOT / "tests" / "reference" / "ci_checked_outputs.json"
#: the profile whose checked outputs REFERENCE records: a profile that extends it changes its sizes or variants on
#: purpose, so its outputs are not compared with these
REFERENCE_PROFILE = "ci"


def executor_for(profile: str, executor: str) -> str:
    """The executor a profile's stages run under: nbval only for REFERENCE_PROFILE (a child inherits the runner
    section, not the reference); papermill otherwise."""
    return executor if executor != "nbval" or profile == REFERENCE_PROFILE else "papermill"
MARK = "NBVAL_CHECK_OUTPUT"


@dataclass(frozen=True)
class Limits:
    """A stage's time limits and where each comes from (said in the error when one is passed)."""
    cell_s: float
    stage_s: float
    cell_why: str
    stage_why: str


def _profile_chain(profile: str) -> list[str]:
    chain = [profile]
    try:
        while (parent := _parent_and_own(chain[-1], tuple(chain[:-1]))[1]) is not None and parent not in chain:
            chain.append(parent)
    except ProfileError:
        pass
    return chain


def recorded(profile: str, stage: str) -> tuple[float | None, float | None, str]:
    """(the longest recorded time of the stage, its slowest cell in a run from nothing, whose records) over the
    profile and every profile it extends, from timings.json on this machine and the committed one. The longest
    time over every record, so a quick rerun never lowers it; the slowest cell only from runs from nothing
    ("stages" rows), since a rerun that read its work back has quick cells that a retraining run would not."""
    walls, cells, whose = [], [], []
    for prof in _profile_chain(profile):
        for f in (ARTIFACTS_ROOT / prof / "timings.json", RESULTS_ROOT / prof / "timings.json"):
            try:
                data = read_json(f) if f.exists() else {}
            except (OSError, ValueError):
                continue
            for key in ("stages", "replayed", "last_run"):
                row = (data.get(key) or {}).get(stage) if isinstance(data, dict) else None
                if isinstance(row, dict) and isinstance(row.get("wall_s"), (int, float)):
                    walls.append(float(row["wall_s"]))
                    whose.append(prof)
                    if key == "stages" and isinstance(row.get("slowest_cell_s"), (int, float)):
                        cells.append(float(row["slowest_cell_s"]))
    if not walls:
        return None, None, ""
    return max(walls), (max(cells) if cells else None), whose[walls.index(max(walls))]


def stage_limits(profile: str, stage: str, cfg: RunnerConfig) -> Limits:
    """The per-cell and per-stage timeouts of one stage (see the module's docstring)."""
    wall, cell, whose = recorded(profile, stage)
    src = f"profile {whose}" if whose == profile else f"profile {whose}, which {profile} extends"
    k = cfg.timeout_multiple
    if cfg.stage_timeout_s is not None:
        stage_s, stage_why = float(cfg.stage_timeout_s), f"runner.stage_timeout_s of profile {profile}"
    elif wall is not None:
        stage_s = max(cfg.stage_floor_s, k * wall)
        stage_why = f"{k:g} x the longest recorded time of this stage, {wall:.0f} s ({src}), floor {cfg.stage_floor_s:.0f} s"
    else:
        stage_s, stage_why = cfg.unrecorded_stage_s, "no time recorded for this stage: runner.unrecorded_stage_s"
    if cfg.cell_timeout_s is not None:
        cell_s, cell_why = float(cfg.cell_timeout_s), f"runner.cell_timeout_s of profile {profile}"
    elif cell is not None:
        cell_s = max(cfg.cell_floor_s, k * cell)
        cell_why = (f"{k:g} x the slowest cell recorded in a run from nothing, {cell:.0f} s ({src}), "
                    f"floor {cfg.cell_floor_s:.0f} s")
    else:
        cell_s, cell_why = stage_s, "no cell time recorded in a run from nothing: the stage's own limit"
    return Limits(min(cell_s, stage_s), stage_s, cell_why, stage_why)


class CellTimeout(RuntimeError):
    """A cell ran past its limit: the message names the notebook, the cell and the time."""


def _failed_cell(executed: Path) -> tuple[int | None, str]:
    """(index, first line) of the last cell that started in an executed (or half-executed) notebook."""
    import nbformat
    try:
        nb = nbformat.read(str(executed), as_version=4)
    except Exception:  # noqa: BLE001 - a notebook cut short by a kill: the cell cannot be named
        return None, ""
    started = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
               and (c.metadata.get("papermill", {}).get("start_time") or c.metadata.get("papermill", {}).get("status") == "failed")]
    if not started:
        return None, ""
    i = started[-1]
    first = next((ln for ln in nb.cells[i].source.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    return i, first[:80]


def cell_text(executed: Path) -> str:
    i, first = _failed_cell(executed)
    return f"cell {i} ({first!r})" if i is not None else "a cell"


def execute_papermill(src: Path, tmp: Path, parameters: dict[str, Any], limits: Limits) -> None:
    """papermill runs the notebook in a kernel of the project's environment, each cell under `limits.cell_s`."""
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError  # lazy: the notebook machinery loads only to run a notebook
    try:
        pm.execute_notebook(os.path.relpath(src, ROOT), os.path.relpath(tmp, ROOT), parameters=parameters,
                            cwd=str(src.parent), kernel_name="python3", progress_bar=True, report_mode=False,
                            request_save_on_cell_execute=True, execution_timeout=int(max(1, limits.cell_s)))
    except CellTimeoutError:
        raise CellTimeout(f"{cell_text(tmp)} ran past its timeout of {limits.cell_s:.0f} s "
                          f"({limits.cell_why})") from None


# ----------------------------------------------------------------------------- nbval
def cell_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def checked_cells(nb) -> list[int]:
    """The indices of the code cells a notebook marks with nbval's NBVAL_CHECK_OUTPUT (comment or tag)."""
    from nbval.plugin import find_comment_markers, find_metadata_tags  # lazy: nbval's own marker rules, read when needed
    out = []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        opts = dict(find_metadata_tags(c.metadata))
        opts.update(dict(find_comment_markers(c.source)))
        if opts.get("check"):
            out.append(i)
    return out


def read_reference() -> dict[str, list[dict[str, Any]]]:
    """notebook file name -> its checked cells' recorded outputs, in order: {"source": digest, "outputs": [...]}."""
    return read_json(REFERENCE) if REFERENCE.exists() else {}


def prepare_for_nbval(src: Path, prepared: Path, parameters: dict[str, Any]) -> list[int]:
    """papermill injects the parameters (nothing runs); then each checked cell gets its recorded output (and an
    execution count, so nbval compares it) and every other cell loses its outputs. A checked cell without a
    recorded output for its current source stays unchecked: returns their indices (the ci-run checks fail on them,
    and `python -m lib.compendium.nbcheck --write` records them)."""
    import nbformat
    import papermill as pm
    pm.execute_notebook(os.path.relpath(src, ROOT), os.path.relpath(prepared, ROOT), parameters=parameters,
                        prepare_only=True, kernel_name="python3", progress_bar=False, report_mode=False)
    nb = nbformat.read(str(prepared), as_version=4)
    ref = read_reference().get(src.name, [])
    unrecorded = []
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    for k, i in enumerate(checked_cells(nb)):
        cell = nb.cells[i]
        rec = ref[k] if k < len(ref) else None
        if rec is None or rec.get("source") != cell_digest(cell.source):
            unrecorded.append(i)
            continue
        cell.outputs = [nbformat.from_dict(o) for o in rec["outputs"]]
        cell.execution_count = k + 1
    nbformat.write(nb, str(prepared))
    return unrecorded


def execute_nbval(src: Path, tmp: Path, parameters: dict[str, Any], limits: Limits, log_dir: Path) -> dict[str, Any]:
    """nbval executes the prepared notebook once (pytest --nbval-lax, one test per cell, stopping at the first
    failure) in the project's environment, each cell under `limits.cell_s`; lib.compendium.nbval_record writes
    the executed notebook to `tmp` as papermill would. Returns nbval's counts (cells passed, checked, failed)."""
    prepared = tmp.with_name(tmp.name.replace(".running.", ".prepared."))
    unrecorded = prepare_for_nbval(src, prepared, parameters)
    xml = log_dir / f"{src.stem}.nbval.xml"
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "--color=no", "-p", "no:cacheprovider", "-p", "lib.compendium.nbval_record",
           "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={int(max(1, limits.cell_s))}",
           "--nbval-kernel-startup-timeout=120", f"--nbval-executed={tmp}", f"--junitxml={xml}",
           "-o", "junit_family=xunit1", "--rootdir", str(ROOT), str(prepared)]
    try:
        rc = subprocess.run(cmd, cwd=ROOT, env=os.environ.copy()).returncode
    finally:
        prepared.unlink(missing_ok=True)
    result = _nbval_result(tmp)
    result["unrecorded"] = unrecorded
    if rc != 0:
        fail = result.get("failure") or {}
        where = f"cell {fail['cell']} ({fail.get('first_line', '')!r})" if fail.get("cell") is not None else "a cell"
        msg = fail.get("message", f"pytest --nbval-lax exited with {rc}")
        if fail.get("timed_out"):
            raise CellTimeout(f"{where} ran past its timeout of {limits.cell_s:.0f} s ({limits.cell_why})")
        raise NbvalFailure(f"{where}: {msg}")
    return result


class NbvalFailure(RuntimeError):
    """nbval found a cell that failed or whose checked output differs from the recorded one."""


def _nbval_result(executed: Path) -> dict[str, Any]:
    import nbformat
    try:
        return dict(nbformat.read(str(executed), as_version=4).metadata.get("nbval", {}))
    except Exception:  # noqa: BLE001 - no executed notebook: the counts are unknown
        return {}


def nbval_totals(profile: str) -> dict[str, int]:
    """What nbval checked in a profile's last run: cells passed, outputs compared, cells failed (from the
    executed notebooks' metadata)."""
    import nbformat
    out = {"notebooks": 0, "cells": 0, "checked": 0, "failed": 0}
    for nb_file in sorted((ARTIFACTS_ROOT / profile / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        meta = nbformat.read(str(nb_file), as_version=4).metadata.get("nbval")
        if not meta:
            continue
        out["notebooks"] += 1
        for k in ("cells", "checked", "failed"):
            out[k] += int(meta.get(k, 0))
    return out
