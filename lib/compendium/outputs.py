"""What a stage wrote, as shapes and schema: the text each notebook's checked cell prints (nbval compares it at ci
sizes with tests/reference/ci_checked_outputs.json), and a reader's inventory of the stage's results.

One line per result file pattern the stage publishes (lib.compendium.results.RESULT_FILES): how many files match,
and for each kind its shape: a CSV's rows and columns (its header), a JSON object's number of keys (a list's
length), a JSON-lines file's rows and the union of its keys. Values are never printed: the shapes hold on any
machine at a profile's sizes, the values move with a CPU's rounding.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

from lib.compendium.artifacts import ARTIFACTS_ROOT, figures_dir, relpath, reused_since
from lib.compendium.results import RESULT_FILES, RESULT_GZIP


def _text(p: Path) -> str:
    data = p.read_bytes()
    return (gzip.decompress(data) if p.suffix == ".gz" else data).decode("utf-8")


def shape(p: Path) -> tuple[str, str]:
    """(kind, shape) of one result file: ("csv", "189 rows x [id, label, ...]"), ("json", "object of 12 keys")..."""
    name = p.name.removesuffix(".gz")
    if name.endswith(".csv"):
        rows = list(csv.reader(io.StringIO(_text(p), newline="")))
        return "csv", f"{max(len(rows) - 1, 0)} rows x [{', '.join(rows[0]) if rows else ''}]"
    if name.endswith(".jsonl"):
        rows = [json.loads(x) for x in _text(p).splitlines() if x.strip()]
        keys = sorted({k for r in rows if isinstance(r, dict) for k in r})
        return "jsonl", f"{len(rows)} rows x [{', '.join(keys)}]"
    if name.endswith(".json"):
        v = json.loads(_text(p))
        if isinstance(v, dict):
            return "json", f"an object of {len(v)} keys"
        if isinstance(v, list):
            return "json", f"a list of {len(v)}"
        return "json", f"a {type(v).__name__}"
    return "file", f"{p.stat().st_size} bytes"


def describe(profile: str, stage: str, root: Path | None = None, skip: tuple[str, ...] = ()) -> str:
    """The inventory of a stage's results (see the module docstring), one line per RESULT_FILES pattern in its
    folder (artifacts/<profile>/<stage>/, or `root`). A pattern that matches no file says so: a stage that wrote
    less than it declares shows it. `skip`: patterns left out (a file whose shape a model's answers decide)."""
    folder = root or ARTIFACTS_ROOT / profile / stage
    lines = []
    for pattern in RESULT_FILES.get(stage, ()):
        if pattern in skip:
            continue
        files = sorted(f for f in folder.glob(pattern) if f.is_file() and not f.name.startswith("."))
        files += sorted(f for f in folder.glob(pattern + ".gz") if pattern in RESULT_GZIP.get(stage, ()))
        if not files:
            lines.append(f"{pattern}: none")
            continue
        shapes = sorted({shape(f)[1] for f in files})
        many = f"{len(files)} files, " if len(files) > 1 or "*" in pattern else ""
        lines.append(f"{pattern}: {many}{shapes[0] if len(shapes) == 1 else f'{len(shapes)} shapes: ' + '; '.join(shapes)}")
    return "\n".join(lines)


def describe_figures(profile: str) -> str:
    """The figures a run drew (notebook 07): how many, and each one's name with the formats saved."""
    d = figures_dir(profile)
    stems = sorted({p.stem for p in d.glob("*.png")} | {p.stem for p in d.glob("*.pdf")}) if d.exists() else []
    lines = [f"{len(stems)} figures in {relpath(d)}"]
    lines += [f"{s}: {' + '.join(x for x in ('png', 'pdf') if (d / f'{s}.{x}').exists())}" for s in stems]
    return "\n".join(lines)


class OutputsMissing(RuntimeError):
    """A stage ran through but did not write what it declares: the message names each missing or empty output."""


#: stages with no metrics.json of their own (notebook 07 draws the figures of the others)
NO_METRICS = ("07_figures",)


def check_outputs(profile: str, stage: str, root: Path | None = None, since: float | None = None) -> None:
    """Raise OutputsMissing unless the stage wrote what it declares: its metrics.json, a non-empty JSON object
    written by this run (modified at or after `since`), every result file it wrote non-empty, and for notebook 07
    at least one figure drawn by this run. A run that did less never replaces a saved notebook or publishes."""
    folder = (root or ARTIFACTS_ROOT) / profile / stage
    problems = []
    if stage not in NO_METRICS:
        m = folder / "metrics.json"
        try:
            data = json.loads(m.read_text(encoding="utf-8")) if m.exists() else None
        except (OSError, ValueError) as e:
            data = None
            problems.append(f"{m.name} is not readable JSON ({e})")
        if data is None and not problems:
            problems.append(f"{m.name} was not written")
        elif not problems and (not isinstance(data, dict) or not data):
            problems.append(f"{m.name} holds no metric")
        elif not problems and since is not None and m.stat().st_mtime < since - 1 and not reused_since(folder, since):
            problems.append(f"{m.name} is an earlier run's (this run did not write it, nor say it reused it)")
    for pattern in RESULT_FILES.get(stage, ()):
        for f in folder.glob(pattern):
            if f.is_file() and f.stat().st_size == 0:
                problems.append(f"{f.relative_to(folder)} is empty")
    if stage == "07_figures":
        d = figures_dir(profile, (root or ARTIFACTS_ROOT).parent) if root is not None else figures_dir(profile)
        drawn = [p for p in d.glob("*.png") if since is None or p.stat().st_mtime >= since - 1] if d.exists() else []
        if not drawn:
            problems.append(f"no figure was drawn in {relpath(d)}")
    if problems:
        raise OutputsMissing(f"finished without writing what it declares (artifacts/{profile}/{stage}/): "
                             + "; ".join(problems))
