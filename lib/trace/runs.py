"""TRACE's runs: one variant as a resumable run folder, many in worker processes, the profile's
configs, reading a trained run back, and the command line `accelerate launch` runs.

    python -m lib.trace.runs --profile paper --backbone clip-vit-l14 --loss-config cls+rel
    accelerate launch --multi_gpu --num_processes 4 -m lib.trace.runs --profile paper --dataset multioff

The method itself (model, losses, feature cache, `Trainer`) is `lib/trace/model.py`.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import multiprocessing as mp
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace as _replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from lib.data import datasets
from lib.compendium.artifacts import RESULTS_ROOT, code_of, require, stage_dir, write_json, write_text
from lib.models.encoders import load_encoder
from lib.compendium.params import ancestors, load_profile
from lib.compendium.presets import PresetError, folder_identity, get_preset, new_accelerator
from lib.trace.model import LOSS_CONFIGS, MODALITIES, MULTIOFF_RECIPE, TrainConfig, unfrozen_layer_indices
from lib.trace.training import Trainer, load_checkpoint
from lib.trace.features import CACHE_DTYPES, FeatureCache, MemeBatchData

VALIDATION_SPLITS = ("dev_seen", "dev_unseen", "val")
TEST_SPLITS = ("test_seen", "test_unseen", "test")


def run_config(section: dict[str, Any], backbone: str | None = None, dataset: str = "fhm",
               **overrides) -> tuple[str, TrainConfig]:
    """The backbone and TrainConfig of one run from a profile's `02_finetuning` section (notebook
    02's parameters): the section's TrainConfig fields (and its `method` mapping of the method's
    constants), then for FHM the backbone's `recipes` entry, for MultiOFF `MULTIOFF_RECIPE` updated
    by the section's `multioff` (whose `backbone` is the default encoder there), then `overrides`.
    The backbone defaults to the section's first."""
    fields = TrainConfig.__dataclass_fields__
    first = (section.get("backbones") or ["memeworld-clip"])[0]
    method = dict(section.get("method") or {})
    unknown = sorted(set(method) - set(fields))
    if unknown:
        raise ValueError(f"02_finetuning.method: unknown key(s) {', '.join(unknown)} (TrainConfig fields: "
                         f"{', '.join(sorted(fields))})")
    if dataset == "multioff":
        recipe = {**MULTIOFF_RECIPE, **(section.get("multioff") or {})}
        default = recipe.pop("backbone", first)
        backbone = backbone or default
    else:
        backbone = backbone or first
        recipe = dict((section.get("recipes") or {}).get(backbone, {}))
    unknown = sorted(set(recipe) - set(fields))
    if unknown:
        where = "multioff" if dataset == "multioff" else f"recipes.{backbone}"
        raise ValueError(f"02_finetuning.{where}: unknown key(s) {', '.join(unknown)} (TrainConfig fields: "
                         f"{', '.join(sorted(fields))})")
    kw = {**{k: v for k, v in section.items() if k in fields}, **method, **recipe, **overrides}
    kw["unfreeze_text_layers"] = tuple(kw.get("unfreeze_text_layers", (-1,)))
    return backbone, TrainConfig(**kw)


def split_rows(data: MemeBatchData) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """train rows, validation rows (dev_seen + dev_unseen, or MultiOFF's val) and each test split's rows."""
    sp = np.array(data.splits)
    tests = {s: np.where(sp == s)[0] for s in TEST_SPLITS if (sp == s).any()}
    return np.where(sp == "train")[0], np.where(np.isin(sp, VALIDATION_SPLITS))[0], tests


def subsample(data: MemeBatchData, max_memes: int, seed: int = 0) -> MemeBatchData:
    """A quick-look copy with at most `max_memes` memes, stratified by split (each split keeps its
    share, at least 8 memes) and drawn with a fixed seed; 0 keeps everything."""
    n = len(data.ids)
    if not max_memes or max_memes >= n:
        return data
    rng = np.random.default_rng(seed)
    sp = np.array(data.splits)
    keep = []
    for s in dict.fromkeys(data.splits):
        rows = np.where(sp == s)[0]
        k = min(len(rows), max(8, round(max_memes * len(rows) / n)))
        keep.extend(sorted(rng.choice(rows, k, replace=False).tolist()))
    keep = np.array(sorted(keep))
    used = np.unique(data.cap_index[keep][data.cap_index[keep] >= 0])
    remap = np.full(len(data.texts), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    ci = data.cap_index[keep]
    ci = np.where(ci >= 0, remap[np.clip(ci, 0, None)], -1)
    return MemeBatchData([data.ids[i] for i in keep], data.labels[keep], [data.splits[i] for i in keep],
                         [data.image_paths[i] for i in keep], ci, [data.texts[i] for i in used], list(data.columns),
                         [data.meta[i] for i in keep] if data.meta else [])


def load_trace_data(path, columns: Sequence[str]) -> MemeBatchData:
    """A TRACE JSON file (notebook 01's output) as MemeBatchData over the meme text + `columns`."""
    path = Path(path)
    # notebook 01 writes absolute image paths into its TRACE JSON (the compendium's own artifact)
    ds = datasets.load("trace", path.parent, file=path.name, image_root="/", caption_columns=None,
                       allow_outside_images=True)
    return MemeBatchData.from_records(ds.records, list(columns))


def data_fingerprint(data: MemeBatchData) -> str:
    """A short hash of what a run trains and is evaluated on (ids, labels, splits, candidate texts)."""
    h = hashlib.sha256()
    h.update(json.dumps([data.ids, data.labels.astype(int).tolist(), data.splits, data.columns]).encode())
    h.update(data.cap_index.tobytes())
    h.update("\n".join(data.texts).encode())
    return h.hexdigest()[:16]


def lowest_layer(encoder, unfreeze_text_layers: Sequence[int]) -> int:
    """The lowest unfrozen text layer: where `FeatureCache` stops."""
    return unfrozen_layer_indices(encoder, unfreeze_text_layers)[0]


def train_variant(encoder, data: MemeBatchData, cfg: TrainConfig, cache: FeatureCache | None = None,
                  progress: bool = True, accelerator=None, checkpoint=None, on_epoch_end=None) -> dict[str, Any]:
    """Fit with validation-based selection, then evaluate every test split at the validation threshold."""
    train, val, tests = split_rows(data)
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"TRACE data has {len(train)} train and {len(val)} validation memes; both are needed "
                         f"(validation splits: {', '.join(VALIDATION_SPLITS)})")
    t0 = time.time()
    tr = Trainer(encoder, data, cfg, cache, progress=progress, accelerator=accelerator)
    fit = tr.fit(train, val, checkpoint=checkpoint, on_epoch_end=on_epoch_end)
    ev = tr.evaluate(val, tests)
    return {"fit": fit, "curve": tr.curve, "eval": ev, "seconds": time.time() - t0, "trainer": tr}


def variant_name(cfg: TrainConfig, backbone: str | None = None, dataset: str = "fhm", main_backbone: str | None = None,
                 tag: str = "") -> str:
    """A run's folder name: <dataset>_<backbone>_<loss config or baseline>[_<tag>]."""
    v = cfg.loss_config.replace("+", "_") if cfg.modality == "both" else f"{cfg.modality}_only"
    return "_".join(x for x in (dataset, backbone or main_backbone or "", v, tag) if x)


def selected_share(predictions: Sequence[dict[str, Any]], columns: Sequence[str], split: str | None = None) -> dict[str, float]:
    """Share of memes whose selected caption is each candidate column (argmax of the inference weights)."""
    rows = [p for p in predictions if split is None or p["split"] == split]
    n = max(1, len(rows))
    return {c: sum(p["selected"] == c for p in rows) / n for c in columns}


#: bumped when result.json gains fields, so older finished runs are retrained rather than half-read
RESULT_FORMAT = 2
#: the modules whose definitions train a run (the model, its loss and training loop, the frozen-feature cache): a
#: change to them retrains every run; a change anywhere else (a figure, a report) retrains none
TRAINING_CODE = ("lib.trace.model", "lib.trace.training", "lib.trace.features",
                 "lib.trace.runs:run_variant,selected_share",                        # what result.json holds
                 "lib.evaluation.metrics:best_threshold,metrics_at,pr_best_f1_threshold",   # its threshold, metrics
                 "lib.models.encoders.loading:image_batches")                         # the pixels it trains on


def backbone_weights(backbone: str) -> str:
    """A short digest of what an encoder preset names: its hub id and revision, or a local folder's weights (a
    retrained memeworld-clip is another backbone, although its name is the same)."""
    try:
        ident: Any = get_preset("encoders", backbone).identity()
    except PresetError:
        ident = folder_identity(backbone)
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_identity(data: MemeBatchData, backbone: str, cfg: TrainConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a run's config.json holds: a finished run with the same identity is read back, not retrained. It names
    the code that trains it (`TRAINING_CODE`'s definitions) and the backbone's weights beside the data and config."""
    return {"backbone": backbone, "data": data_fingerprint(data), "config": json.loads(json.dumps(asdict(cfg))),
            "result_format": RESULT_FORMAT, "training_code": code_of(*TRAINING_CODE),
            "backbone_weights": backbone_weights(backbone), **(extra or {})}


def reuse_parents_run(run_dir, want: dict[str, Any]) -> str | None:
    """A run of a child profile (params/<child>.yaml: `extends: ...`) that its parent already finished under the same
    identity (code, backbone weights, data and configuration: the child's change did not touch it): the parent's run
    copied here, from its run in artifacts/<parent>/ (weights included) or its committed results (what notebook 02
    reads of it), so only what the child's change moved is trained. Returns where it came from, or None."""
    run_dir = Path(run_dir)
    parts = run_dir.resolve().parts
    if len(parts) < 5 or parts[-5] != "artifacts":
        return None
    profile, stage, runs, name = parts[-4:]
    root = Path(*parts[:-5])
    for parent in ancestors(profile):
        for src in (root / "artifacts" / parent / stage / runs / name, root / "results" / parent / stage / runs / name):
            try:
                same = json.loads((src / "config.json").read_text()) == want
            except (OSError, ValueError):
                continue
            if not same or not (src / "result.json").exists():
                continue
            run_dir.mkdir(parents=True, exist_ok=True)
            for f in sorted(src.iterdir()):
                if f.is_file() and not f.name.startswith("."):
                    data = f.read_bytes()
                    target = run_dir / f.name
                    if f.name.endswith(".gz"):
                        data, target = gzip.decompress(data), run_dir / f.name[:-3]
                    target.write_bytes(data)
            return str(src.relative_to(root))
    return None


def is_finished(run_dir, data: MemeBatchData, backbone: str, cfg: TrainConfig) -> bool:
    d = Path(run_dir)
    try:
        return (d / "result.json").exists() and (d / "predictions.csv").exists() and \
            json.loads((d / "config.json").read_text()) == run_identity(data, backbone, cfg)
    except (OSError, json.JSONDecodeError):
        return False


def run_variant(run_dir, data: MemeBatchData, backbone: str, cfg: TrainConfig, make_encoder, make_cache=None,
                progress: bool = True, accelerator=None, on_epoch_end=None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One TRACE variant as a resumable run in `run_dir`:

    - `config.json`: backbone, TrainConfig and the data fingerprint (written first);
    - `checkpoint.pt`: the full training state after every epoch (a killed run resumes after its
      last finished epoch and ends with the same metrics as an uninterrupted run);
    - `result.json` (fit, curve, evaluation without predictions, selected-caption shares) and
      `predictions.csv` when the run is finished.
    A finished run with the same configuration and data is read back, not retrained (runs launched
    elsewhere, e.g. `accelerate launch -m lib.trace.model`, are collected the same way). A folder holding
    another configuration's run is moved to `runs/.superseded/` (never deleted) before training.
    make_encoder(): a fresh encoder; make_cache(encoder): its FeatureCache (or None)."""
    run_dir = Path(run_dir)
    main = accelerator is None or accelerator.is_main_process
    want = run_identity(data, backbone, cfg, extra)
    if main and not (run_dir / "config.json").exists():
        reuse_parents_run(run_dir, want)       # a child profile's run its change did not touch: the parent's
    if accelerator is not None:
        accelerator.wait_for_everyone()        # every rank sees the copied run before it decides to train
    cfg_path, res_path, pred_path, ck = (run_dir / "config.json", run_dir / "result.json",
                                         run_dir / "predictions.csv", run_dir / "checkpoint.pt")
    if cfg_path.exists():
        try:
            have = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg_path}: not valid JSON ({e}); move the folder aside to retrain") from e
        if have != want:
            if main:
                dest = run_dir.parent / ".superseded" / f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(run_dir), str(dest))
                print(f"{run_dir.name}: the configuration or data changed; the old run was moved to {dest}")
            if accelerator is not None:
                accelerator.wait_for_everyone()
        elif res_path.exists() and pred_path.exists():
            res = json.loads(res_path.read_text())
            preds = pd.read_csv(pred_path, dtype={"id": str}).to_dict("records")
            return {**res, "eval": {**res["eval"], "predictions": preds}, "trained": False, "dir": str(run_dir)}
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(cfg_path, want)
    resumed = None
    if ck.exists():
        resumed = int(load_checkpoint(ck)["epoch"]) + 1
    enc = make_encoder()
    cache = make_cache(enc) if make_cache is not None and cfg.cache_frozen else None
    r = train_variant(enc, data, cfg, cache, progress=progress, accelerator=accelerator,
                      checkpoint=ck if main else None, on_epoch_end=on_epoch_end)
    ev = {k: v for k, v in r["eval"].items() if k != "predictions"}
    res = {"name": run_dir.name, "backbone": backbone, "fit": r["fit"], "curve": r["curve"], "eval": ev,
           "seconds": r["seconds"], "resumed_after_epoch": resumed,
           "selected_share": {s: selected_share(r["eval"]["predictions"], data.columns, s) for s in ev["splits"]}}
    if main:
        write_text(pred_path, pd.DataFrame(r["eval"]["predictions"]).to_csv(index=False))
        write_json(res_path, res)
    return {**res, "eval": r["eval"], "trained": True, "dir": str(run_dir)}


_WORKER: dict[str, Any] = {}


def _worker_init(src: str, columns: list[str], max_memes: int, seed: int, device: str | None) -> None:
    torch.set_num_threads(1)                 # one thread per process: the processes share the cores
    _WORKER.update(data=subsample(load_trace_data(src, columns), max_memes, seed), caches={}, device=device)


def _worker_run(job: tuple[str, str, dict[str, Any]]) -> str:
    run_dir, backbone, cfg_d = job
    cfg, data, caches = TrainConfig(**cfg_d), _WORKER["data"], _WORKER["caches"]

    run_variant(run_dir, data, backbone, cfg, lambda: load_encoder(backbone, device=_WORKER["device"]),
                lambda enc: shared_cache(caches, data, backbone, cfg, enc), progress=False)
    return run_dir


def run_variants(jobs: Sequence[tuple[Any, str, TrainConfig]], src, columns: Sequence[str], max_memes: int = 0,
                 seed: int = 0, workers: int = 2, device: str | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Several resumable runs (run_dir, backbone, TrainConfig) on the TRACE JSON `src`, trained
    `workers` processes at a time with one torch thread each, then collected with run_variant
    (finished runs are read back, never retrained). On a small CPU two single-thread trainings
    finish sooner than the same two one after the other (notebook 02's eight FHM runs: 7 minutes
    instead of 9.5 on 2 cores). A single-thread run rounds differently from a multi-thread run of
    the same seed, and over 24 epochs the difference grows to the size of a seed's (measured on
    the default model: test_seen AUROC 0.905 with 2 threads, 0.899 with 1): runs trained here are
    replicates of sequential runs, not copies. workers=1 trains in this process (a GPU: one
    process owns it), exactly as run_variant does."""
    data = subsample(load_trace_data(src, columns), max_memes, seed)
    jobs = list(jobs)
    for d, b, c in jobs:                     # a child profile's runs its change did not touch: the parent's, copied
        if not Path(d, "config.json").exists():
            reuse_parents_run(d, run_identity(data, b, c))
    order = by_backbone([b for _, b, _ in jobs])          # one backbone's feature cache in memory at a time
    todo = [(str(d), b, asdict(c)) for d, b, c in (jobs[i] for i in order) if not is_finished(d, data, b, c)]
    if todo and workers > 1:
        with ProcessPoolExecutor(min(workers, len(todo)), mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                 initargs=(str(src), list(columns), max_memes, seed, device)) as ex:
            for _ in tqdm(ex.map(_worker_run, todo), total=len(todo), desc="TRACE runs", disable=not progress):
                pass
    caches: dict[Any, FeatureCache] = {}
    out: dict[int, dict[str, Any]] = {}
    for i in order:
        d, b, c = jobs[i]
        out[i] = run_variant(d, data, b, c, lambda b=b: load_encoder(b, device=device),
                             lambda enc, b=b, c=c: shared_cache(caches, data, b, c, enc), progress=False)
    return [out[i] for i in range(len(jobs))]


def by_backbone(backbones: Sequence[str]) -> list[int]:
    """Job indices grouped by backbone (backbones in order of first appearance, jobs in their order
    within one), so runs sharing a feature cache run one after another."""
    first = {b: k for k, b in reversed(list(enumerate(backbones)))}
    return sorted(range(len(backbones)), key=lambda i: (first[backbones[i]], i))


def shared_cache(caches: dict[Any, FeatureCache], data: MemeBatchData, backbone: str, cfg: TrainConfig,
                 encoder) -> FeatureCache:
    """The feature cache runs of one backbone and lowest unfrozen layer share, built once from a
    fresh (untrained) encoder and kept in `caches`. Only one backbone's caches stay in memory: a
    cache of another backbone is dropped before this one is built (the paper profile's three
    backbones would otherwise hold about 30 GiB of host memory at once; `python -m lib.compendium.costs`)."""
    key = (backbone, lowest_layer(encoder, cfg.unfreeze_text_layers))
    if key not in caches:
        for other in [k for k in caches if k[0] != backbone]:
            del caches[other]
        caches[key] = FeatureCache(encoder, data, lowest_unfrozen=key[1], progress=False)
    return caches[key]


def run_caption_columns(run_dir) -> list[str]:
    """The caption columns a finished run selected among (its candidates minus the meme text), in
    order: what to load beside it, whatever the captioners were called (embedded: vlm_caption,
    tag_caption; the real TRACE JSON: ivl_8b_new_caption, gemini_caption, ...)."""
    res = Path(run_dir) / "result.json"
    if not res.exists():
        raise FileNotFoundError(f"{res}: missing; the run is not finished (notebook 02 or python -m lib.trace.runs)")
    shares = json.loads(res.read_text()).get("selected_share", {})
    cols = list(next(iter(shares.values()), {}))
    if not cols:
        raise ValueError(f"{res}: no selected_share, so the run's candidate columns are unknown")
    return [c for c in cols if c != "text"]


def load_trained(run_dir, data: MemeBatchData, make_encoder) -> tuple["Trainer", float]:
    """A finished run's model, ready to score other memes: `data` holds them (any memes with the
    run's candidate columns; notebook 06 scores prompt-injected copies this way). The weights are
    the restored epoch's (the last epoch's when the run had restore_best off); the threshold is the
    run's validation threshold. Returns (trainer, threshold): `trainer.predict(rows)`."""
    run_dir = Path(run_dir)
    for f in ("config.json", "checkpoint.pt", "result.json"):
        if not (run_dir / f).exists():
            raise FileNotFoundError(f"{run_dir / f}: missing; the run is not finished (notebook 02 or python -m lib.trace.model)")
    cfg = TrainConfig(**json.loads((run_dir / "config.json").read_text())["config"])
    res = json.loads((run_dir / "result.json").read_text())
    trained_on = list(next(iter(res["selected_share"].values()), {}))
    if trained_on and trained_on != list(data.columns):
        raise ValueError(f"{run_dir}: trained with candidates {trained_on}; these memes have {data.columns}")
    threshold = float(res["eval"]["threshold"])
    ck = load_checkpoint(run_dir / "checkpoint.pt")
    enc = make_encoder()
    tr = Trainer(enc, data, _replace(cfg, cache_frozen=False), None, progress=False)
    state = ck["best_state"] if cfg.restore_best and ck.get("best_state") else (ck["model"], ck["trainable"])
    tr.model.load_state_dict(state[0])
    tr.load_trainable(state[1])
    return tr, threshold


def retrain_committed(profile: str, names: Sequence[str], results_root: Path, progress: bool = True) -> list[str]:
    """Retrain TRACE runs of notebook 02 from their committed configurations (results/<profile>/02_finetuning/runs/
    <name>/config.json), on this checkout's caption file, the way notebook 02 trains them (worker processes of one
    thread each), into artifacts/<profile>/02_finetuning/runs/<name>/: what a fresh clone's notebook 06 needs (the
    trained weights it loads), without notebook 02. Each retrained run must give the committed predictions; a run
    whose data or predictions differ from the committed ones is an error naming it (another CPU's numerics, or
    captions that moved). Returns the names retrained."""
    sec = load_profile(profile).get("02_finetuning", {})
    src = require(profile, "trace_captions", "lib.trace.runs.retrain_committed")
    columns, max_memes, seed = sec.get("caption_columns", []), int(sec.get("max_memes", 0) or 0), int(sec.get("seed", 0) or 0)
    data = subsample(load_trace_data(src, columns), max_memes, seed)
    runs_dir = stage_dir(profile, "02_finetuning") / "runs"
    jobs = []
    for name in names:
        done = Path(results_root) / profile / "02_finetuning" / "runs" / name
        cfg_file = done / "config.json"
        if not cfg_file.exists():
            raise FileNotFoundError(f"{cfg_file}: no committed run {name} to retrain (make reproduce NB=02)")
        want = json.loads(cfg_file.read_text())
        if want.get("data") != data_fingerprint(data):
            raise ValueError(f"{name}: the captions here ({src}) differ from the committed run's data "
                             f"({want.get('data')} != {data_fingerprint(data)}): run notebook 02 here instead")
        d = runs_dir / name
        for f in ("config.json", "result.json", "predictions.csv"):      # copied from the committed results: the
            (d / f).unlink(missing_ok=True)                              # run trains, it does not read them back
        jobs.append((d, want["backbone"], TrainConfig(**want["config"])))
    run_variants(jobs, src, columns, max_memes, seed, workers=int(sec.get("train_workers", 1) or 1),
                 device=sec.get("device"), progress=progress)
    for (d, _, _), name in zip(jobs, names):
        committed = Path(results_root) / profile / "02_finetuning" / "runs" / name / "predictions.csv.gz"
        plain = committed.with_suffix("")
        want = (gzip.decompress(committed.read_bytes()) if committed.exists() else plain.read_bytes()).decode()
        got = pd.read_csv(d / "predictions.csv", dtype={"id": str})
        old = pd.read_csv(io.StringIO(want), dtype={"id": str})
        if not got[["id", "prediction"]].equals(old[["id", "prediction"]]):
            raise ValueError(f"{name}: retrained here it predicts otherwise than the committed run "
                             f"({int((got.prediction != old.prediction).sum())} of {len(old)} memes): this CPU trains "
                             f"other weights; run notebook 02 here (make reproduce NB=02)")
    return list(names)


def main(argv: Sequence[str] | None = None) -> int:
    """Train one TRACE variant from a profile, single- or multi-process, as a resumable run:

        python -m lib.trace.runs --profile paper --backbone clip-vit-l14 --loss-config cls+rel
        accelerate launch --multi_gpu --num_processes 4 -m lib.trace.runs --profile paper --dataset multioff

    Reads the profile's `02_finetuning` section (its `method`, `recipes` and `multioff` entries)
    and the TRACE JSON from notebook 01; writes config.json, checkpoint.pt (every epoch),
    result.json and predictions.csv under artifacts/<profile>/02_finetuning/runs/<name>/, the
    folder notebook 02 collects. Run it again after a kill and it resumes from the last epoch."""
    ap = argparse.ArgumentParser(prog="python -m lib.trace.runs", description=main.__doc__.split("\n")[0])
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--dataset", choices=("fhm", "multioff"), default="fhm")
    ap.add_argument("--backbone", help="encoder preset (default: the profile's first backbone)")
    ap.add_argument("--loss-config", choices=sorted(LOSS_CONFIGS))
    ap.add_argument("--modality", choices=MODALITIES, default="both")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--tag", default="", help="suffix of the run's folder name")
    ap.add_argument("--cache-dtype", choices=CACHE_DTYPES,
                    help="host dtype of the cached text hidden states (default float32, exact)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--retrain-committed", default=None, metavar="RUN,RUN",
                    help="retrain these committed runs of notebook 02 from their results/<profile>/ configurations "
                         "(what a fresh clone's notebook 06 loads)")
    a = ap.parse_args(argv)
    if a.retrain_committed:
        names = [n for n in a.retrain_committed.split(",") if n]
        print(f"retrained: {', '.join(retrain_committed(a.profile, names, RESULTS_ROOT, progress=not a.no_progress))}")
        return 0
    p = load_profile(a.profile).get("02_finetuning", {})
    acc = None
    try:
        acc = new_accelerator(mixed_precision="no")  # AMP is the Trainer's own autocast
    except ImportError:                              # accelerate is optional here: the device is then the profile's
        pass
    device = str(acc.device) if acc is not None else p.get("device")
    given = {"loss_config": a.loss_config, "epochs": a.epochs, "cache_dtype": a.cache_dtype, "seed": a.seed}
    backbone, cfg = run_config(p, a.backbone, a.dataset, modality=a.modality,
                               **{k: v for k, v in given.items() if v is not None})
    src = require(a.profile, "trace_captions_multioff" if a.dataset == "multioff" else "trace_captions",
                  "python -m lib.trace.runs")
    data = load_trace_data(src, p.get("caption_columns", []))

    def make_cache(enc):
        c = FeatureCache(enc, data, lowest_layer(enc, cfg.unfreeze_text_layers), progress=not a.no_progress,
                         store_dtype=cfg.cache_dtype)
        print(f"feature cache: {c.nbytes / 2**30:.2f} GiB ({cfg.cache_dtype} hidden states)")
        return c

    name = variant_name(cfg, backbone, a.dataset, tag=a.tag)
    out = stage_dir(a.profile, "02_finetuning") / "runs" / name
    r = run_variant(out, data, backbone, cfg, lambda: load_encoder(backbone, device=device), make_cache,
                    progress=not a.no_progress, accelerator=acc)
    if acc is None or acc.is_main_process:
        flat = {f"{s}_{k}": v for s, m in r["eval"]["splits"].items() for k, v in m.items()}
        state = "trained" if r["trained"] else "already finished"
        print(f"{name} ({state}): " + ", ".join(f"{k} {v:.3f}" for k, v in flat.items() if isinstance(v, float)))
        print(f"run folder: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
