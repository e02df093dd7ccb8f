"""When a stage is up to date: its stamp, the identity of everything its last run used.

A stage's stamp is a digest of its parameters, its notebook's code (or its module), and what its processes
recorded using in its last run (lib.compendium.usage): the definitions of each library module they imported,
the prompt, schema and preset files they opened, and the contents of every other stage's output they read
(under artifacts/<profile>/ or the committed results/<profile>/). So an edit to lib/arcade/ leaves the TRACE
stages up to date, and a stage whose upstream reran to the same bytes stays up to date too. A stage with no
record (a run killed before its processes could write one) counts as using every module, every parameter file
and every earlier stage, as before usage was recorded.
"""
from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any

from lib import ROOT
from lib.compendium.artifacts import ARTIFACTS_ROOT, file_digest, source_digest
from lib.compendium.params import Stage

#: parameter files every stage may read (the others: profiles, which the stamp holds as the stage's section)
PARAM_DIRS = ("prompts", "schemas", "presets", "analysis")
#: files and folders of a run that are no stage's result: reading them makes no dependency
NOT_RESULTS = {"cache", "notebooks", "figures", "report", "test-logs", ".runs", ".usage"}
NOT_RESULT_FILES = {"timings.json", ".stamp.json", "manifest.json", ".from_results.json"}


class Digests:
    """File digests memoised for one run of the runner (a file is hashed once however many stages read it)."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, int, int], str] = {}

    def file(self, path: Path) -> str:
        try:
            st = path.stat()
        except FileNotFoundError:
            return "missing"
        if not stat.S_ISREG(st.st_mode):
            return "not a file"                        # a folder opened to list or sync it: no content of its own
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self._memo:
            self._memo[key] = file_digest(path)[:16]
        return self._memo[key]

    def module(self, path: Path) -> str:
        try:
            st = path.stat()
        except FileNotFoundError:
            return "missing"
        key = ("module:" + str(path), st.st_size, st.st_mtime_ns)
        if key not in self._memo:
            self._memo[key] = source_digest(path)
        return self._memo[key]


def notebook_code(nb: Path) -> str:
    import nbformat
    cells = nbformat.read(str(nb), as_version=4).cells
    return "\n".join(c.source for c in cells if c.cell_type == "code"
                     and "injected-parameters" not in c.metadata.get("tags", []))


def classify(opened: list[str], profile: str, stage: str) -> dict[str, list[str]]:
    """The files a stage's processes opened, by what they make it depend on: "params" (prompt, schema and preset
    files), "upstream" (another stage's outputs, in artifacts/ or the committed results). The rest (its own
    folder, caches, the library, site-packages, the notebooks) is not a dependency or is counted elsewhere."""
    out: dict[str, list[str]] = {"params": [], "upstream": []}
    for rel in opened:
        parts = Path(rel).parts
        if len(parts) >= 3 and parts[0] == "params" and parts[1] in PARAM_DIRS:
            out["params"].append(rel)
        elif (len(parts) >= 4 and parts[0] in ("artifacts", "results") and parts[1] == profile
              and parts[2] != stage and parts[2] not in NOT_RESULTS and parts[-1] not in NOT_RESULT_FILES
              and not parts[-1].startswith(".")):
            out["upstream"].append(rel)
    return out


def reads_of(usage: dict[str, Any] | None, profile: str, stage: str) -> list[str]:
    """The other stages a stage read outputs of, in its recorded usage (their folder names)."""
    if not usage:
        return []
    return sorted({Path(r).parts[2] for r in classify(usage.get("opened", []), profile, stage)["upstream"]})


def all_code(digests: Digests) -> dict[str, str]:
    """Every library module and parameter file: what a stage with no usage record is taken to depend on."""
    files = {str(f.relative_to(ROOT)): digests.module(f) for f in sorted((ROOT / "lib").rglob("*.py"))}
    files.update({str(f.relative_to(ROOT)): digests.file(f) for d in PARAM_DIRS
                  for f in sorted((ROOT / "params" / d).rglob("*")) if f.is_file()})
    return files


def stage_stamp(stage: Stage, section: dict[str, Any], profile: str, usage: dict[str, Any] | None,
                before: str, digests: Digests) -> str:
    """The stage's stamp (see the module's docstring). `before`: the chained stamps of the stages before it, used
    only when there is no usage record."""
    own = notebook_code(stage.notebook) if stage.notebook is not None else stage.module
    if usage is None:
        deps: dict[str, Any] = {"lib": all_code(digests), "before": before}
    else:
        files = classify(usage.get("opened", []), profile, stage.name)
        deps = {"modules": {name: digests.module(ROOT / rel) for name, rel in sorted(usage.get("modules", {}).items())},
                "param_files": {rel: digests.file(ROOT / rel) for rel in files["params"]},
                "upstream": {rel: digests.file(ROOT / rel) for rel in files["upstream"]}}
    blob = json.dumps({"params": section, "code": own, **deps}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def changed_during(stage: Stage, usage: dict[str, Any] | None, profile: str, since: float) -> list[str]:
    """The files a stage used (the modules and parameter files of its usage record) modified after `since`, the
    stage's start: a stamp computed now would hold code the run did not execute, so none is written and the next run
    reruns the stage. (The notebook, which a run rewrites with its outputs, is compared by its code: `notebook_code`.)"""
    files: list[Path] = []
    if usage is not None:
        files += [ROOT / rel for rel in usage.get("modules", {}).values()]
        files += [ROOT / rel for rel in classify(usage.get("opened", []), profile, stage.name)["params"]]
    out = []
    for f in files:
        try:
            if Path(f).stat().st_mtime > since:
                out.append(str(Path(f).relative_to(ROOT)))
        except (OSError, ValueError):
            continue
    return sorted(set(out))


def stamp_file(profile: str, stage: Stage, root: Path | None = None) -> Path:
    """artifacts/<profile>/<stage>/.stamp.json (`root`: another artifacts folder)."""
    return (root or ARTIFACTS_ROOT) / profile / stage.name / ".stamp.json"


def recorded(profile: str, stage: Stage, root: Path | None = None) -> dict[str, Any]:
    """What the stage's last finished run recorded ({"stamp", "usage"}), or {} (never finished, or unreadable)."""
    f = stamp_file(profile, stage, root)
    try:
        rec = json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def current_stamps(all_stages: list[Stage], sections: dict[str, dict[str, Any]], profile: str,
                   digests: Digests | None = None, root: Path | None = None) -> dict[str, str]:
    """Every stage's stamp now, from the usage its last run recorded (in order: a stage without a record
    chains the stamps before it)."""
    digests = digests or Digests()
    out: dict[str, str] = {}
    before = ""
    for st in all_stages:
        usage = recorded(profile, st, root).get("usage")
        before = out[st.name] = stage_stamp(st, sections[st.name], profile, usage, before, digests)
    return out


def up_to_date(profile: str, stage: Stage, stamp: str, root: Path | None = None) -> bool:
    rec = recorded(profile, stage, root)
    return bool(rec) and rec.get("stamp") == stamp


def stale_stages(all_stages: list[Stage], sections: dict[str, dict[str, Any]], profile: str,
                 root: Path | None = None) -> list[str]:
    """The stages a run would rerun now (their inputs changed since they last finished, or they never did)."""
    stamps = current_stamps(all_stages, sections, profile, root=root)
    return [st.name for st in all_stages if not up_to_date(profile, st, stamps[st.name], root)]
