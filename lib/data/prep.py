"""Stage 00: build (embedded) or validate (paper) every dataset the later stages read.

The stage writes `artifacts/<profile>/00_data_prep/datasets.json`: dataset name ->
{root, loader kwargs}, paths relative to the repository root. Later stages load data
only through it (`load_prepared`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from lib.data import memeworld, memeworld_align, memeworld_draw, memeworld_files
from lib.compendium.artifacts import (code_digest, project_path, read_json, relpath, require, stage_dir, write_json,
                                      write_manifest)
from lib.data.datasets import REGISTRY, load_source, memeworld_sources, missing_files
from lib.data.records import DataError, Dataset
from lib.data.memeworld import load_specs
from lib.data.memeworld_files import write_memeworld

STAGE = "00_data_prep"

#: the modules whose code generates MemeWorld (their digest is part of the world's cache key)
GENERATOR = (memeworld, memeworld_draw, memeworld_align, memeworld_files)


def _rel_sources(sources: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, src in sources.items():
        out[name] = {k: (relpath(v) if k in ("root", "image_root") else v) for k, v in src.items()}
    return out


def build_memeworld(profile: str, params: dict[str, Any], force: bool = False) -> Path:
    """Generate MemeWorld under the stage folder; reuse it when its parameters are unchanged."""
    out = stage_dir(profile, STAGE) / "memeworld"
    keys = ("memeworld_n", "memeworld_seed", "memeworld_n_multioff", "image_size", "label_noise", "confounder_rate")
    # the generator's code is part of the cache key: a change to its rules rebuilds the world (moving
    # code, comments or imports does not: artifacts.code_digest)
    wanted = {**{k: params[k] for k in keys}, "generator_sha256": code_digest(*GENERATOR)[:16]}
    stamp = out / "params.json"
    if not force and stamp.exists() and read_json(stamp) == wanted and (out / "datasheet.json").exists():
        print(f"MemeWorld unchanged: reusing {relpath(out)}")
        return out
    sheet = write_memeworld(out, n=params["memeworld_n"], seed=params["memeworld_seed"], image_size=params["image_size"],
                            label_noise=params["label_noise"], confounder_rate=params["confounder_rate"],
                            n_multioff=params["memeworld_n_multioff"])
    # the render time is a measurement, not data: beside the world, never inside it
    write_json(stage_dir(profile, STAGE) / "memeworld_render.json", {"render_seconds": sheet["render_seconds"]})
    write_json(stamp, wanted)
    return out


def missing_report(sources: dict[str, dict[str, Any]], also_missing: Sequence[str] = ()) -> str:
    """One message listing every dataset whose files are absent, what to download and where, and
    `also_missing`: the profile's other local files that are absent (lib.compendium.params.missing_local_files)."""
    lines = list(also_missing)
    for name, src in sources.items():
        root = project_path(src["root"])
        miss = [str(root)] if not root.exists() else [str(root / f) for f in missing_files(name, root)]
        if miss:
            lines.append(f"  - {name}: missing {', '.join(relpath(m) for m in miss)}\n"
                         f"      get it from: {REGISTRY[name].source}")
    if not lines:
        return ""
    return ("These files are missing for this profile (dataset roots: section 00_data_prep.datasets of its "
            "params file; the others: the key named):\n" + "\n".join(lines))


def prepare(profile: str, params: dict[str, Any], also_missing: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Build or validate the datasets; write datasets.json and the manifest; return the sources.
    `also_missing`: other files the profile needs that are absent; they fail here, with the datasets."""
    if also_missing and params["build_memeworld"]:
        raise FileNotFoundError(missing_report({}, also_missing))
    if params["build_memeworld"]:
        out = build_memeworld(profile, params)
        sources = memeworld_sources(out)
    else:
        sources = {k: dict(v) for k, v in params["datasets"].items()}
        unknown = [k for k in sources if k not in REGISTRY]
        if unknown:
            raise DataError(f"params/{profile}.yaml: 00_data_prep.datasets names unknown datasets {unknown}; "
                            f"registered: {sorted(REGISTRY)}")
        for src in sources.values():
            src["root"] = str(project_path(src["root"]))
            if "image_root" in src:
                src["image_root"] = str(project_path(src["image_root"]))
        msg = missing_report(sources, also_missing)
        if msg:
            raise FileNotFoundError(msg)
    d = stage_dir(profile, STAGE)
    rel = _rel_sources(sources)
    write_json(d / "datasets.json", rel)
    write_manifest(d, params, outputs=["datasets.json", "metrics.json"] + (["memeworld"] if params["build_memeworld"] else []))
    return sources


def load_all(sources: dict[str, dict[str, Any]], strict: bool = True, check_images: str = "exists"
             ) -> dict[str, Dataset]:
    out = {}
    for name, src in tqdm(sources.items(), desc="load datasets"):
        s = dict(src)
        s["root"] = str(project_path(s["root"]))
        if "image_root" in s:
            s["image_root"] = str(project_path(s["image_root"]))
        out[name] = load_source(name, s, strict=strict, check_images=check_images)
    return out


def load_prepared(profile: str, name: str, consumer: str, file: str | None = None, **kw) -> Dataset:
    """Load dataset `name` as stage 00 declared it (fails at once, naming NB=00, if absent); `file`
    reads another file of it with the same loader and root (e.g. HAT's validation copy
    `hat_val.json` beside `hat.json`)."""
    sources = read_json(require(profile, "datasets", consumer))
    if name not in sources:
        raise KeyError(f"{consumer}: dataset '{name}' was not prepared for profile '{profile}' "
                       f"(prepared: {sorted(sources)})")
    src = sources[name] if file is None else {**sources[name], "file": file}
    return load_all({name: src}, **kw)[name]


def counts_table(datasets: dict[str, Dataset]):
    """Records per dataset and split, with the hateful share where labels exist."""
    import pandas as pd
    rows = []
    for name, ds in datasets.items():
        df = ds.to_frame()
        for split, g in df.groupby("split", sort=False):
            row = {"dataset": name, "family": REGISTRY[name].family, "split": split, "n": len(g)}
            if "label" in g and g["label"].notna().any():
                row["n_hateful"] = int(g["label"].sum())
                row["hateful_share"] = round(float(g["label"].mean()), 3)
            if "misaligned_words" in g:
                row["misaligned_share"] = round(float(g["misaligned_words"].map(bool).mean()), 3)
            rows.append(row)
    return pd.DataFrame(rows)


def type_table(ds: Dataset):
    """H-VLI-style counts: interaction type x difficulty, per split."""
    df = ds.to_frame()
    return df.pivot_table(index=["type", "difficulty"], columns="split", values="id", aggfunc="count",
                          fill_value=0)


def gallery(records: list, n: int = 16, cols: int = 4, title_fn=None):
    """A grid of memes with their labels (matplotlib Figure)."""
    import matplotlib.pyplot as plt
    n = min(n, len(records))
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 2.6, rows * 2.9))
    for ax in axes.flat:
        ax.axis("off")
    for ax, r in zip(axes.flat, records[:n]):
        ax.imshow(r.image())
        ax.set_title(title_fn(r) if title_fn else str(r.id), fontsize=7.5)
    fig.tight_layout()
    return fig


def noisy_ids(profile: str) -> set[str]:
    """Ids of MemeWorld memes whose final label was flipped by label noise (not shown as examples)."""
    mw = stage_dir(profile, STAGE, create=False) / "memeworld"
    if not (mw / "memeworld.jsonl").exists():
        return set()
    return {str(r["id"]) for r in load_specs(mw) if r["final_label"] != r["final_label_clean"]}


#: the per-meme gold of MemeWorld that results/ keeps (memes.csv): what the later stages' per-type,
#: per-split and confounder numbers are recomputed against. `confounder`: the benign-confounder kind,
#: "original" for a meme that has confounders, "none" otherwise.
GOLD_COLUMNS = ("id", "split", "label", "type", "difficulty", "confounder")


def gold_table(profile: str):
    """One row per MemeWorld meme (FHM view) with GOLD_COLUMNS; an empty frame without MemeWorld."""
    import pandas as pd
    mw = stage_dir(profile, STAGE, create=False) / "memeworld"
    if not (mw / "memeworld.jsonl").exists():
        return pd.DataFrame(columns=list(GOLD_COLUMNS))
    rows = load_specs(mw)
    partners = {str(r["confounder_of"]) for r in rows if r.get("confounder_of") is not None}
    return pd.DataFrame([{"id": str(r["id"]), "split": r["split"], "label": int(r["final_label"]), "type": r["type"],
                          "difficulty": r["difficulty"],
                          "confounder": r.get("confounder_kind") or ("original" if str(r["id"]) in partners else "none")}
                         for r in rows], columns=list(GOLD_COLUMNS))


def smi_title(r) -> str:
    m = r.meta
    return (f"type {m['type']} ({m['difficulty']})\n"
            f"text {m['text_label']}  image {m['image_label']}  final {m['final_label']}")


def pick_per_type(records: list, per_type: int = 2, exclude: set | None = None) -> list:
    """The first `per_type` records of each interaction type, in type order (ids in `exclude` skipped)."""
    by = {}
    for r in records:
        if exclude and r.id in exclude:
            continue
        by.setdefault(r.meta["type"], [])
        if len(by[r.meta["type"]]) < per_type:
            by[r.meta["type"]].append(r)
    return [r for t in sorted(by) for r in by[t]]
