"""What a stage needs from the stages before it, and where a fresh clone gets it.

A stage reads other stages' outputs under artifacts/<profile>/. On a fresh clone there are none, but a published
profile commits most of them under results/<profile>/ (metrics, claims, per-item predictions, settings, the few
MemeWorld images the figures show). `NEEDS` says, per stage and per stage it reads, where the input comes from
when that stage has not run here:

- "results": the committed results are the input: copied into artifacts/<profile>/<that stage>/ (gzipped ones
  unpacked), listed in that folder's `.from_results.json`, never written back, and removed before that stage
  itself runs here (so it computes its own, never reads the committed ones back as if it had);
- "run": what it reads is not committed (MemeWorld's files, trained models, caption files): that stage runs here
  first, without publishing (`make reproduce NB=.. DEPS=1`);
- "results+trace_runs": the committed results, and the few TRACE runs whose trained weights the stage loads
  retrained here from their committed configurations (checked against their committed predictions).

Before a stage runs, the runner prints this plan with the measured time of each thing it must regenerate, and
runs it only when asked (DEPS=1); copying committed results needs no asking.
"""
from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lib import ROOT
from lib.compendium.artifacts import ARTIFACTS, ARTIFACTS_ROOT, RESULTS_ROOT, read_json, write_bytes, write_json
from lib.compendium.params import ancestors, load_profile, stages
from lib.compendium.presets import nearest_overlay

#: stage -> {stage it reads: how a fresh clone gets it} (see the module's docstring); a stage it reads that is
#: not listed must have run here (the runner says so and runs it with DEPS=1)
NEEDS: dict[str, dict[str, str]] = {
    "models": {"00_data_prep": "run"},
    "01_captioning": {"00_data_prep": "run", "models": "run"},
    "02_finetuning": {"00_data_prep": "run", "models": "run", "01_captioning": "run"},
    "03_clip4dm": {"00_data_prep": "run", "models": "run"},
    "serving": {},
    "04_few_shot": {"00_data_prep": "run", "models": "run"},
    "05_debate": {"00_data_prep": "run", "models": "run", "04_few_shot": "run"},
    "06_evaluation": {"00_data_prep": "run", "models": "run", "01_captioning": "run",
                      "02_finetuning": "results+trace_runs", "03_clip4dm": "results", "04_few_shot": "results",
                      "05_debate": "results"},
    "07_figures": {"00_data_prep": "results", "models": "results", "01_captioning": "results",
                   "02_finetuning": "results", "03_clip4dm": "results", "serving": "results", "04_few_shot": "results",
                   "05_debate": "results", "06_evaluation": "results"},
}
MARKER = ".from_results.json"
#: where a stage's committed results keep the dataset images its figures show (results/<profile>/<stage>/...),
#: under their path inside artifacts/<profile>/
FIGURE_IMAGES = "figure_images"


def inherited_stages(profile: str) -> dict[str, str]:
    """stage -> the nearest profile it extends whose section of that stage (and of every stage before it that the
    stage reads, lib.compendium.inputs.NEEDS) the child leaves as it is: such a stage computes what the parent's
    computes, so a child profile reuses the parent's outputs of it instead of running it again. A child that runs
    with another preset overlay than its parent (params/presets/overlays/) inherits nothing from it: its presets may
    name other models."""
    mine = load_profile(profile)
    out: dict[str, str] = {}
    chain = ancestors(profile)

    def overlay_text(p: str, parents: list[str]) -> str | None:
        f = nearest_overlay(p, parents)
        return f.read_text(encoding="utf-8") if f.exists() else None
    own_overlay = overlay_text(profile, chain)
    for k, parent in enumerate(chain):
        if overlay_text(parent, chain[k + 1:]) != own_overlay:
            continue
        theirs = load_profile(parent)
        for st in stages():
            if st.name in out:
                continue
            ups = [st.name] + [u for u in NEEDS.get(st.name, {})]
            if all(mine.get(u) == theirs.get(u) for u in ups) and all(u == st.name or u in out for u in ups):
                out[st.name] = parent
    return out


def finished(profile: str, stage: str, root: Path | None = None) -> bool:
    """Whether the stage has run to its end here (its stamp is written when it finishes)."""
    return ((root or ARTIFACTS_ROOT) / profile / stage / ".stamp.json").exists()


def committed(profile: str, stage: str, results: Path | None = None) -> bool:
    d = (results or RESULTS_ROOT) / profile / stage
    return d.is_dir() and any(d.iterdir())


@dataclass
class Plan:
    """How the inputs of the chosen stages are provided, in the order the runner does it."""
    copy: list[str] = field(default_factory=list)          # take these stages' committed results
    inherit: list[tuple[str, str]] = field(default_factory=list)   # (stage, parent profile): take the parent's
    run_parent: list[tuple[str, str]] = field(default_factory=list)   # (stage, parent): run it for the parent first
    run: list[str] = field(default_factory=list)           # run these stages here first (not published)
    trace_runs: list[str] = field(default_factory=list)    # retrain these TRACE runs from their committed configs
    missing: list[tuple[str, str]] = field(default_factory=list)   # (stage, stage it reads): neither here nor committed

    @property
    def regenerates(self) -> bool:
        return bool(self.run or self.trace_runs or self.run_parent)


def trace_runs_needed(profile: str) -> list[str]:
    """The TRACE runs notebook 06 loads trained weights of (its injection runs), as run folder names."""
    sec = load_profile(profile).get("06_evaluation", {})
    ds = sec.get("trace_dataset", "fhm")
    return [f"{ds}_{name}" for name in sec.get("injection_trace_runs", [])]


def plan(profile: str, chosen: list[str], root: Path | None = None, results: Path | None = None) -> Plan:
    """Where the chosen stages' inputs come from. A stage of this run provides its outputs to the later ones, a stage
    finished here is used as it is; for the others NEEDS says: committed results copied, or the stage run here first
    (and what it needs in turn), or the few TRACE runs retrained."""
    order = [s.name for s in stages()]
    p = Plan()
    providing = set(chosen)                                # stages whose outputs this run will have
    inherited = inherited_stages(profile)                  # a child profile's stages that compute what its parent's do
    todo = [s for s in order if s in providing]
    while todo:
        st = todo.pop(0)
        for up, how in NEEDS.get(st, {}).items():
            if up in providing or up in p.copy or finished(profile, up, root):
                continue
            parent = inherited.get(up)
            if parent is not None:                         # the parent's outputs are this child's: reused, not rerun
                providing.add(up)
                if finished(parent, up, root):
                    p.inherit.append((up, parent))
                elif how.startswith("results") and committed(parent, up, results):
                    p.inherit.append((up, parent + ":results"))
                else:
                    p.run_parent.append((up, parent))
                    p.inherit.append((up, parent))
                continue
            if how.startswith("results") and committed(profile, up, results):
                p.copy.append(up)
                if how == "results+trace_runs":
                    runs = (root or ARTIFACTS_ROOT) / profile / up / "runs"
                    p.trace_runs += [r for r in trace_runs_needed(profile) if not (runs / r / "checkpoint.pt").exists()]
            else:                                          # not committed (or never): it runs here first
                p.run.append(up)
                p.missing.append((st, up))
                providing.add(up)
                todo.append(up)                            # and what it needs in turn
    p.copy = [s for s in order if s in p.copy and s not in providing]
    p.run = [s for s in order if s in p.run]
    return p


def take_from_parent(profile: str, stage: str, parent: str, root: Path | None = None,
                     results: Path | None = None) -> list[str]:
    """A child profile's stage that computes what its parent's computes (params.inherited_stages): the parent's
    outputs copied into artifacts/<profile>/<stage>/ (from the parent's run here, or `parent:results`: its committed
    results), marked as taken; the parent's stamp and usage are not copied (the child never ran it)."""
    if parent.endswith(":results"):
        return take_from_results(profile, stage, root, results, source=parent.rsplit(":", 1)[0])
    src = (root or ARTIFACTS_ROOT) / parent / stage
    dest = (root or ARTIFACTS_ROOT) / profile / stage
    marker = dest / MARKER
    taken = set(read_json(marker).get("files", [])) if marker.exists() else set()
    copied = []
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src).as_posix()
        if not f.is_file() or rel in (".stamp.json", MARKER) or rel.startswith(".usage"):
            continue
        target = dest / rel
        # a file the child's own run wrote is never overwritten; one taken from the parent before is refreshed
        # when the parent's has changed since (the parent reran)
        if not target.exists() or (rel in taken and target.read_bytes() != f.read_bytes()):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
            copied.append(rel)
        if rel in taken or rel in copied:
            taken.add(rel)
    write_json(marker, {"from": f"artifacts/{parent}/{stage}", "files": sorted(taken)})
    return copied


def take_from_results(profile: str, stage: str, root: Path | None = None, results: Path | None = None,
                      source: str | None = None) -> list[str]:
    """Copy a stage's committed results into artifacts/<profile>/<stage>/ (gzipped files unpacked to their names,
    the dataset images its figures show put back where they were), never over a file a run wrote there; list what
    was copied in the folder's .from_results.json. Returns the relative paths copied."""
    src = (results or RESULTS_ROOT) / (source or profile) / stage
    base = (root or ARTIFACTS_ROOT) / profile
    dest = base / stage
    dest.mkdir(parents=True, exist_ok=True)
    marker = dest / MARKER
    copied: list[str] = list(read_json(marker).get("files", [])) if marker.exists() else []
    for f in sorted(src.rglob("*")):
        if not f.is_file():
            continue
        rel = f.relative_to(src).as_posix()
        if rel.startswith(FIGURE_IMAGES + "/"):
            target, name = base / rel[len(FIGURE_IMAGES) + 1:], "../" + rel[len(FIGURE_IMAGES) + 1:]
        else:
            name = rel[:-3] if rel.endswith(".gz") else rel
            target = dest / name
        if target.exists() and name not in copied:
            continue                                          # this run's own file: never replaced
        data = f.read_bytes()
        write_bytes(target, gzip.decompress(data) if rel.endswith(".gz") and not rel.startswith(FIGURE_IMAGES) else data)
        if name not in copied:
            copied.append(name)
    write_json(marker, {"from": f"results/{source or profile}/{stage}", "files": sorted(copied)})
    return sorted(copied)


def drop_taken(profile: str, stage: str, root: Path | None = None) -> int:
    """Before a stage runs here: remove what was copied into its folder from the committed results (its run computes
    its own). Returns how many files were removed."""
    dest = (root or ARTIFACTS_ROOT) / profile / stage
    marker = dest / MARKER
    if not marker.exists():
        return 0
    n = 0
    for name in read_json(marker).get("files", []):
        f = dest / name
        if name.startswith("../"):
            continue                 # a figure image put back in another stage's folder: what that stage makes too
        if f.is_file():
            f.unlink()
            n += 1
    marker.unlink()
    return n


def taken(profile: str, stage: str, root: Path | None = None) -> dict[str, Any]:
    """The marker of a stage folder whose files came from the committed results ({} when none did)."""
    marker = (root or ARTIFACTS_ROOT) / profile / stage / MARKER
    return read_json(marker) if marker.exists() else {}


def publish_figure_images(profile: str, stage: str, folder: Path, dest: Path) -> list[str]:
    """The dataset images a stage's figures show (the `img` paths its figure inputs name), copied into its committed
    results under figure_images/<path inside artifacts/<profile>/>, so the figures redraw from the results alone."""
    from lib.evaluation.figures import REGISTRY  # lazy: the registry, every paper's figure module imported
    base = folder.parent
    paths: set[Path] = set()
    for fig in REGISTRY.values():
        if not fig.images:
            continue
        for name, fields in fig.artifacts:
            art = ARTIFACTS[name]
            if art.stage != stage or not art.relpath.endswith(".json"):
                continue
            f = folder / art.relpath.format(**dict(fields))
            if f.exists():
                paths |= _image_paths(json.loads(f.read_text(encoding="utf-8")), base)
    out = []
    for p in sorted(paths):
        rel = p.relative_to(base).as_posix()
        target = dest / FIGURE_IMAGES / rel
        data = p.read_bytes()
        if not target.exists() or target.read_bytes() != data:
            write_bytes(target, data)
        out.append(f"{FIGURE_IMAGES}/{rel}")
    return out


def _image_paths(value: Any, base: Path) -> set[Path]:
    """Every existing image file under `base` a decoded JSON names (any string ending in an image suffix)."""
    out: set[Path] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack += list(v.values())
        elif isinstance(v, list):
            stack += v
        elif isinstance(v, str) and v.lower().endswith((".png", ".jpg", ".jpeg")):
            p = Path(v) if Path(v).is_absolute() else ROOT / v
            try:
                p.resolve().relative_to(base.resolve())
            except ValueError:
                continue
            if p.is_file():
                out.add(p.resolve())
    return out


def forget(profile: str, stage: str, root: Path | None = None) -> None:
    """Remove a stage's folder whose every file came from the committed results (nothing of a run here is lost)."""
    d = (root or ARTIFACTS_ROOT) / profile / stage
    if taken(profile, stage, root) and not finished(profile, stage, root):
        shutil.rmtree(d, ignore_errors=True)
