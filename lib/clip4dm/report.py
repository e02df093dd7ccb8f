"""Notebook 03's evaluation of one encoder on every benchmark, so that one run covers a list of
backbones (the paper's table has B/32, L/14 and H/14 rows) without one overwriting another.

`run_encoder` attributes every distinct (image file, caption) pair once (resumable
`attributions.jsonl`), then scores FOIL / nocaps-FOIL (`most_negative`), the F-CLIPScore ablation,
the epsilon sweep on the validation copy and HAT / RichHF / SeeTRUE (`threshold` at the chosen
epsilon), writing `results_<benchmark>.csv`, `ablation.csv` and `epsilon_sweep.csv` into the
encoder's folder: the stage folder itself for the first encoder of the list (the files every later
notebook reads), `<stage>/<encoder>/` for each other one. `by_encoder_frame` puts the encoders side
by side with the paper's numbers where the paper reports that backbone.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from lib.clip4dm import method as clip4dm
from lib.clip4dm import runs
from lib.data.records import AlignmentRecord, caption_words, normalize_word
from lib.compendium.artifacts import stage_dir, write_text
from lib.compendium.params import load_profile
from lib.data import prep as data_prep
from lib.compendium.presets import resolve_model_path

FOIL_KEYS = ("la", "la_official_string", "n_repeated_foil_word", "la_chance", "la_chance_content", "ap_clipscore",
             "ap_neg_attribution", "ap_fclipscore", "ap_chance", "n_pairs")

#: the paper's tables (REFERENCE.md §2): FOIL and nocaps-FOIL LA / AP per backbone preset
PAPER_ROWS: dict[str, dict[str, float]] = {
    "clip-vit-b32": {"la": 0.73, "ap_fclipscore": 0.71, "nocaps_la": 0.60, "nocaps_ap_fclipscore": 0.69},
    "clip-vit-h14": {"la": 0.84, "ap_fclipscore": 0.81, "nocaps_la": 0.72, "nocaps_ap_fclipscore": 0.80},
}

#: the columns of the side-by-side table (metric key -> column name)
BY_ENCODER_COLUMNS = {"la": "FOIL LA", "ap_fclipscore": "FOIL AP (F-CLIPScore)", "ap_clipscore": "FOIL AP (CLIPScore)",
                      "nocaps_la": "nocaps LA", "nocaps_ap_fclipscore": "nocaps AP (F-CLIPScore)",
                      "epsilon_chosen": "epsilon", "hat_la": "HAT LA", "hat_ap": "HAT AP",
                      "richhf_spearman_neg_attribution": "RichHF Spearman (neg. attribution)",
                      "seetrue_share_with_phrase": "SeeTRUE share with a phrase", "seetrue_nli_score": "SeeTRUE NLI",
                      "pairs_per_s_batched": "pairs/s (batched, ready pixels)"}


def encoder_folder(name: str) -> str:
    """A folder name for an encoder preset or a local model path."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(os.path.normpath(name)) if os.sep in name else name)


def encoder_dir(stage_out: Path, encoder: str, first: bool) -> Path:
    """Where an encoder's files go: the stage folder for the first encoder, a subfolder otherwise."""
    d = Path(stage_out) if first else Path(stage_out) / encoder_folder(encoder)
    d.mkdir(parents=True, exist_ok=True)
    return d


def benchmark_pairs(data: dict[str, Any], val_recs: Sequence[Any] = ()) -> dict[str, list[tuple[str, str]]]:
    """One (real image path, caption) pair per record and benchmark (`hat_val`: the validation copy):
    every benchmark's view of an image is the same file, so pairs are shared across benchmarks."""
    pairs = {name: [(os.path.realpath(r.img_path), r.caption) for r in ds.records] for name, ds in data.items()}
    if val_recs:
        pairs["hat_val"] = [(os.path.realpath(r.img_path), r.caption) for r in val_recs]
    return pairs


@dataclass
class EncoderRun:
    """One encoder's attributions and scores on every benchmark."""
    encoder: str
    out_dir: Path
    pairs: dict[str, list[tuple[str, str]]]
    raw_by: dict[tuple[str, str], dict[str, Any]]
    epsilon: float
    metrics: dict[str, Any] = field(default_factory=dict)
    foil_table: pd.DataFrame | None = None
    ablation: pd.DataFrame | None = None
    sweep: pd.DataFrame | None = None
    epsilon_chosen: float | None = None
    threshold_table: pd.DataFrame | None = None
    seetrue_note: str | None = None

    @property
    def n_unique(self) -> int:
        return len(self.raw_by)

    def results(self, name: str, sorted_by: str, eps: float | None = None) -> list[dict[str, Any]]:
        """The official result dicts for benchmark `name` under one selection rule."""
        e = self.epsilon if eps is None else eps
        return [clip4dm.select(self.raw_by[p], sorted_by, e) for p in self.pairs[name]]


#: nocaps' domains (the release's names) and their metric suffixes
NOCAPS_DOMAIN_KEYS = {"in-domain": "in", "near-domain": "near", "out-domain": "out"}


def _domain_order(dom: str) -> tuple[int, str]:
    return (list(NOCAPS_DOMAIN_KEYS).index(dom) if dom in NOCAPS_DOMAIN_KEYS else len(NOCAPS_DOMAIN_KEYS), dom)


def swap_attributions(recs, res) -> list[float]:
    """Each caption's attribution at its pair's swap position: a foil's at its foil word, an original's at the word
    the foil of its image replaced (an image's first foil). What an oracle that knows where a foil would differ, but
    not which caption is the foil, reads from CLIP4DM's own attributions: the claims' positive control puts it through
    the F-CLIPScore formula (lib.clip4dm.claims). 0 where the position holds no attributed word."""
    where: dict[str, int] = {}
    for r in recs:
        if r.is_foil and r.misaligned_positions:
            where.setdefault(str(r.img_path), int(r.misaligned_positions[0]))
    out = []
    for r, x in zip(recs, res):
        pos = where.get(str(r.img_path))
        attrs, positions = clip4dm._all_words(x)
        out.append(next((float(sc) for (_, sc), q in zip(attrs, positions) if q == pos), 0.0) if pos is not None else 0.0)
    return out


def _foil_frame(recs, res) -> pd.DataFrame:
    """results_<foil benchmark>.csv: one row per pair with what its metrics read (the words' counts give the
    LA chance lines; whether the foil word's string repeats tells where LA by string and by position differ; the
    attribution at the pair's swap position feeds the claims' positive control)."""
    words = [[w for w, _ in clip4dm._all_words(x)[0]] for x in res]
    return pd.DataFrame({"id": [r.id for r in recs], "image": [f"{Path(r.img_path).parent.name}/{Path(r.img_path).name}" for r in recs],
                         "domain": [r.group for r in recs], "is_foil": [r.is_foil for r in recs],
                         "foil_word": [r.misaligned_words[0] if r.is_foil else "" for r in recs],
                         "foil_position": [r.misaligned_positions[0] if r.misaligned_positions else None for r in recs],
                         "negative_word": [x["negative_word"] for x in res],
                         "lowest_word_position": [x["lowest_word_position"] for x in res],
                         "clip_score": [x["clip_score"] for x in res], "f_clipscore": [clip4dm.f_clipscore(x) for x in res],
                         "sum_negative_attribution": [x["sum_negative_attribution"] for x in res],
                         "swap_attribution": swap_attributions(recs, res),
                         "n_words": [len([w for w in ws if w not in clip4dm.PUNCT]) for ws in words],
                         "n_content_words": [len(clip4dm.content_words(ws)) for ws in words],
                         "foil_word_repeated": [r.is_foil and sum(normalize_word(w) == normalize_word(r.misaligned_words[0])
                                                                  for w in caption_words(r.caption)) > 1
                                                for r in recs]})


def _threshold_frame(recs, res, eps: float, raw: Sequence[dict[str, Any]] | None = None,
                     extra: dict[str, Sequence[Any]] | None = None) -> pd.DataFrame:
    """results_<threshold benchmark>.csv: one row per pair; `raw`: each pair's stored attributions (word
    attributions, positions, cosine as JSON: what every threshold metric is recomputed from); `extra`:
    further per-pair columns (SeeTRUE's NLI scores)."""
    t = pd.DataFrame({"id": [r.id for r in recs], "caption": [r.caption for r in recs],
                      "misaligned": [" ".join(r.misaligned_words) for r in recs],
                      "misaligned_positions": [r.misaligned_positions for r in recs], "score": [r.score for r in recs],
                      "negative_word": [x["negative_word"] for x in res],
                      "predicted_phrase": [clip4dm.predicted_phrase_text(x, eps) for x in res],
                      "clip_score": [x["clip_score"] for x in res], "f_clipscore": [clip4dm.f_clipscore(x) for x in res]})
    if raw is not None:
        t["attribution"] = [json.dumps({"word_attributions": x["word_attributions"], "cos": x["cos"],
                                        "word_positions": x.get("word_positions")}, separators=(",", ":")) for x in raw]
    for k, v in (extra or {}).items():
        t[k] = list(v)
    return t


def score_foil(run: EncoderRun, data: dict[str, Any]) -> None:
    """FOIL and nocaps-FOIL (most_negative): LA by position and by string, AP by each score; nocaps
    also per domain. Writes results_<benchmark>.csv and ablation.csv."""
    rows = []
    for name in [b for b in ("foil", "nocaps_foil") if b in data]:
        recs = data[name].records
        res = run.results(name, "most_negative")
        m = clip4dm.evaluate_foil(res, recs)
        rows.append({"benchmark": name, **{k: m[k] for k in FOIL_KEYS}})
        if name == "nocaps_foil":
            for dom in sorted({r.group for r in recs}, key=_domain_order):
                idx = [i for i, r in enumerate(recs) if r.group == dom]
                md = clip4dm.evaluate_foil([res[i] for i in idx], [recs[i] for i in idx])
                rows.append({"benchmark": f"nocaps_foil/{dom}", **{k: md[k] for k in FOIL_KEYS}})
                short = NOCAPS_DOMAIN_KEYS.get(dom)
                if short:
                    run.metrics.update({f"nocaps_la_{short}": md["la"], f"nocaps_ap_fclipscore_{short}": md["ap_fclipscore"],
                                        f"nocaps_ap_clipscore_{short}": md["ap_clipscore"]})
        run.metrics.update({(k if name == "foil" else f"nocaps_{k}"): m[k] for k in FOIL_KEYS
                            if k not in ("ap_chance", "n_pairs")})
        write_text(run.out_dir / f"results_{name}.csv", _foil_frame(recs, res).to_csv(index=False))
    run.foil_table = pd.DataFrame(rows).round(3)
    if rows:
        write_text(run.out_dir / "foil_table.csv", run.foil_table.to_csv(index=False))
    if rows:
        abl = run.foil_table.set_index("benchmark")[["ap_clipscore", "ap_neg_attribution", "ap_fclipscore"]].T
        abl.index = ["CLIPScore alone", "sum of negative attributions", "F-CLIPScore"]
        write_text(run.out_dir / "ablation.csv", abl.to_csv())
        run.ablation = abl


#: validation word-F1 within this of the best counts as a tie (the grid's F1 moves by less between neighbours)
EPSILON_TIE = 0.01


def choose_epsilon(run: EncoderRun, val_recs: Sequence[Any], grid: Sequence[float], tie: float = EPSILON_TIE) -> float:
    """Epsilon on the validation copy (never on test): among the grid values whose word-level F1 is
    within `tie` of the best, the one that abstains least (the smallest share of misaligned
    validation captions with no word below epsilon), then the best F1. A bare arg-max of F1 on a
    near tie can pick a threshold so strict that a benchmark scored by its phrases (SeeTRUE) gets
    no phrase for most captions. The run's configured epsilon when there is no validation copy.
    Writes epsilon_sweep.csv (every grid value, the tie band and the choice)."""
    if not val_recs:
        run.epsilon_chosen = run.epsilon
        run.metrics["epsilon_chosen"] = run.epsilon
        return run.epsilon
    as_richhf = [AlignmentRecord(r.id, r.img_path, r.caption, r.misaligned_words,
                                       misaligned_positions=r.misaligned_positions, score=float(r.is_foil))
                 for r in val_recs]
    misaligned = [k for k, r in enumerate(val_recs) if r.misaligned_words]
    sweep = []
    for eps in grid:
        rv = run.results("hat_val", "threshold", eps)
        h = clip4dm.evaluate_hat(rv, val_recs, eps)
        tok = clip4dm.evaluate_richhf(rv, as_richhf, eps)
        kept = [len([w for w, s in x["word_attributions"] if s < eps]) for x in rv]
        share = np.mean([k / max(1, len(x["word_attributions"])) for k, x in zip(kept, rv)])
        abstain = float(np.mean([kept[k] == 0 for k in misaligned])) if misaligned else float("nan")
        sweep.append({"epsilon": eps, "word_f1": tok["richhf_f1"], "word_precision": tok["richhf_precision"],
                      "word_recall": tok["richhf_recall"], "hat_la": h["hat_la"], "share_of_words_kept": share,
                      "share_abstaining": abstain})
    sweep = pick_epsilon(pd.DataFrame(sweep), tie)
    chosen = float(sweep.loc[sweep["chosen"], "epsilon"].iloc[0])
    write_text(run.out_dir / "epsilon_sweep.csv", sweep.to_csv(index=False))
    run.sweep, run.epsilon_chosen = sweep, chosen
    row = sweep[sweep["chosen"]].iloc[0]
    run.metrics.update({"epsilon_chosen": chosen, "epsilon_val_share_abstaining": float(row["share_abstaining"]),
                        "epsilon_val_word_f1": float(row["word_f1"])})
    return chosen


def pick_epsilon(sweep: pd.DataFrame, tie: float = EPSILON_TIE) -> pd.DataFrame:
    """The rule of choose_epsilon on a sweep (epsilon, word_f1, share_abstaining): marks
    `within_tie` (F1 within `tie` of the best) and `chosen` (the least abstaining in that band,
    then the best F1)."""
    sweep = sweep.copy()
    sweep["within_tie"] = sweep["word_f1"] >= sweep["word_f1"].max() - tie
    band = sweep[sweep["within_tie"]].sort_values(["share_abstaining", "word_f1"], ascending=[True, False],
                                                  na_position="last")
    sweep["chosen"] = sweep.index == band.index[0]
    return sweep


def score_threshold_benchmarks(run: EncoderRun, data: dict[str, Any], nli_model=None, device: str | None = None) -> None:
    """HAT, RichHF and SeeTRUE under `threshold` at the chosen epsilon, as the official main.py
    scores them; writes results_<benchmark>.csv with each pair's attributions (and SeeTRUE's NLI
    scores per caption), from which every one of these metrics is recomputed."""
    eps = run.epsilon if run.epsilon_chosen is None else run.epsilon_chosen
    rows, res_by, extra = [], {}, {}
    if "hat" in data:
        res_by["hat"] = run.results("hat", "threshold", eps)
        m = clip4dm.evaluate_hat(res_by["hat"], data["hat"].records, eps)
        run.metrics.update(m)
        rows.append({"benchmark": "hat", **m})
    if "richhf" in data:
        res_by["richhf"] = run.results("richhf", "threshold", eps)
        m = clip4dm.evaluate_richhf(res_by["richhf"], data["richhf"].records, eps)
        run.metrics.update(m)
        rows.append({"benchmark": "richhf", **m})
    if "seetrue" in data:
        recs = data["seetrue"].records
        res_by["seetrue"] = run.results("seetrue", "threshold", eps)
        per = clip4dm.seetrue_caption_scores(res_by["seetrue"], recs, eps, nli_model, device) if nli_model else None
        m = clip4dm.evaluate_seetrue(res_by["seetrue"], recs, eps, nli_model, device, per_caption=per)
        run.seetrue_note = m["seetrue_note"] + ("" if m["seetrue_nli"] is None else f" -> {m['seetrue_nli']:.3f}")
        run.metrics["seetrue_share_with_phrase"] = m["seetrue_share_with_phrase"]
        if m["seetrue_nli"] is not None:
            run.metrics["seetrue_nli_score"] = m["seetrue_nli"]
            oracle, guess = seetrue_control_scores(recs, nli_model, device)
            if np.isfinite(oracle).any():
                run.metrics.update({"seetrue_nli_oracle": float(np.nanmean(oracle)),
                                    "seetrue_nli_random_word": float(np.nanmean(guess))})
            extra["seetrue"] = {"nli_score": per, "nli_oracle": oracle, "nli_random_word": guess}
            held = nli_heldout_accuracy(nli_model)
            if held is not None:
                run.metrics["nli_heldout_acc"] = held
    for name, res in res_by.items():
        raw = [run.raw_by[p] for p in run.pairs[name]]
        write_text(run.out_dir / f"results_{name}.csv",
                   _threshold_frame(data[name].records, res, eps, raw, extra.get(name)).to_csv(index=False))
    run.threshold_table = pd.DataFrame(rows).set_index("benchmark").T if rows else None


def seetrue_control_scores(records: Sequence[Any], nli_model, device: str | None = None,
                           seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Where SeeTRUE's NLI score can lie with this NLI model, per record (NaN where the record has no
    annotation): the annotation scored against itself (a perfect localiser: `seetrue_nli_oracle` is the
    mean) and one random content word of the caption (a localiser that guesses: `seetrue_nli_random_word`)."""
    oracle, guess = np.full(len(records), np.nan), np.full(len(records), np.nan)
    idx = [i for i, r in enumerate(records) if r.misaligned_words]
    if not idx:
        return oracle, guess
    rng = np.random.default_rng(seed)
    words = []
    for i in idx:
        ws = [w.strip(",.") for w in clip4dm.content_words(records[i].caption.split())]
        words.append(ws[rng.integers(len(ws))] if ws else "")
    prem = [records[i].misaligned_words[0] for i in idx]
    oracle[idx] = clip4dm.nli_entailment(prem, prem, nli_model, device)
    guess[idx] = clip4dm.nli_entailment(prem, words, nli_model, device)
    return oracle, guess


def seetrue_controls(records: Sequence[Any], nli_model, device: str | None = None, seed: int = 0) -> dict[str, float]:
    """The two controls' means over the records with an annotation (seetrue_control_scores); {} without any."""
    oracle, guess = seetrue_control_scores(records, nli_model, device, seed)
    if not np.isfinite(oracle).any():
        return {}
    return {"seetrue_nli_oracle": float(np.nanmean(oracle)), "seetrue_nli_random_word": float(np.nanmean(guess))}


def nli_heldout_accuracy(nli_model) -> float | None:
    """The held-out accuracy an NLI model trained here recorded (memeworld-nli's training.json); None
    for a model from elsewhere (bart-large-mnli reports its own MNLI accuracy)."""
    if not isinstance(nli_model, str):
        return None
    p = Path(resolve_model_path(nli_model)) / "training.json"
    if not p.exists():
        return None
    return json.loads(p.read_text()).get("metrics", {}).get("nli_heldout_acc")


def run_encoder(model: clip4dm.CLIP4DM, encoder: str, data: dict[str, Any], out_dir, *, epsilon: float,
                val_recs: Sequence[Any] = (), epsilon_grid: Sequence[float] = (), nli_model=None,
                device: str | None = None, batch_size: int = 32) -> EncoderRun:
    """Every benchmark for one encoder: attributions (resumable, shared across benchmarks), FOIL /
    nocaps, the ablation, epsilon on validation, HAT / RichHF / SeeTRUE."""
    out_dir = Path(out_dir)
    pairs = benchmark_pairs(data, val_recs)
    unique = list(dict.fromkeys(p for ps in pairs.values() for p in ps))
    raw = runs.attribute_pairs(model, unique, out_dir / "attributions.jsonl", batch_size=batch_size,
                                  desc=f"attribute ({encoder})")
    run = EncoderRun(encoder, out_dir, pairs, dict(zip(unique, raw)), epsilon)
    score_foil(run, data)
    choose_epsilon(run, val_recs, epsilon_grid)
    score_threshold_benchmarks(run, data, nli_model, device)
    return run


def speed_metrics(model: clip4dm.CLIP4DM, records: Sequence[Any], n_pairs: int, batch_size: int = 32) -> dict[str, float]:
    """From one run on the same pairs and batch size: the floor (forward + backward on ready
    inputs) and the batched path on ready pixel tensors, timed in alternation (`floor_ratio`);
    the batched path from PIL images against one pair at a time (the official way: the speed-up
    and the largest difference); and the benchmark path with image reuse, from image files."""
    sp = list(records)[:n_pairs]
    imgs, caps = [r.image() for r in sp], [r.caption for r in sp]
    speed = runs.benchmark(model, imgs, caps, batch_size=batch_size)
    floor, batched, ready = runs.floor_and_batched(model, imgs, caps, batch_size=batch_size)
    reuse = runs.reuse_pairs_per_s(model, [os.path.realpath(r.img_path) for r in sp], caps, batch_size=batch_size)
    return {"pairs": speed.pairs, "batch_size": speed.batch_size, "pairs_per_s_batched": batched,
            "pairs_per_s_batched_from_images": speed.pairs_per_s_batched, "pixels_ready": ready,
            "pairs_per_s_single": speed.pairs_per_s_single, "batched_speedup": speed.speedup,
            "batched_max_abs_diff": speed.max_abs_diff, "pairs_per_s_floor": floor,
            "floor_ratio": floor / batched, "pairs_per_s_reuse": reuse}


def by_encoder_frame(metrics_by_encoder: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per encoder (the headline columns) and, under it, the paper's row for that backbone
    where the paper reports one (`source` says which is which)."""
    rows = []
    for enc, m in metrics_by_encoder.items():
        rows.append({"encoder": enc, "source": "this run", **{c: m.get(k, np.nan) for k, c in BY_ENCODER_COLUMNS.items()}})
        if enc in PAPER_ROWS:
            rows.append({"encoder": enc, "source": "paper", **{c: PAPER_ROWS[enc].get(k, np.nan)
                                                                for k, c in BY_ENCODER_COLUMNS.items()}})
    return pd.DataFrame(rows)


def keyed_metrics(metrics_by_encoder: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`<metric>@<encoder>` for every encoder's metrics (written beside the first encoder's plain keys
    when a run covers several encoders)."""
    return {f"{k}@{enc}": v for enc, m in metrics_by_encoder.items() for k, v in m.items() if v is not None}


#: the hard-negative ablation's rows: metric suffix -> what the model is
HARD_NEGATIVE_ROLES = {"leak_free": "leak-free, FOIL hard negatives",
                       "no_hard_negatives": "leak-free, no hard negatives"}
ABLATION_SCORES = {"ap_clipscore": "CLIPScore alone", "ap_neg_attribution": "sum of negative attributions",
                   "ap_fclipscore": "F-CLIPScore"}


def hard_negative_ablation(models: dict[str, str], data: dict[str, Any], stage_out, main_run: EncoderRun, *,
                           template: str, start_layer_text: int, epsilon: float, device: str | None = None,
                           batch_size: int = 32) -> tuple[pd.DataFrame, dict[str, float]]:
    """The F-CLIPScore ablation (CLIPScore alone, negative attributions, F-CLIPScore) on FOIL and
    nocaps-FOIL for the main encoder and for the models named in `models` (role -> encoder preset;
    roles `leak_free` and `no_hard_negatives`), each scored into `<stage>/<encoder>/` like a further
    encoder. Returns the long table (`hard_negatives.csv`) and the metrics `<score>_<role>` (FOIL)
    and `nocaps_<score>_<role>`."""
    bench = {k: v for k, v in data.items() if k in ("foil", "nocaps_foil")}
    rows, metrics = [], {}

    def add(role_label: str, encoder: str, run: EncoderRun) -> None:
        for name in bench:
            prefix = "" if name == "foil" else "nocaps_"
            for key in ("la", *ABLATION_SCORES):
                rows.append({"model": role_label, "encoder": encoder, "benchmark": name,
                             "metric": "LA" if key == "la" else ABLATION_SCORES[key],
                             "value": run.metrics.get(f"{prefix}{key}", np.nan)})

    add("main (trained on every training pair)", main_run.encoder, main_run)
    for role, encoder in models.items():
        if role not in HARD_NEGATIVE_ROLES:
            raise ValueError(f"hard_negative_ablation: unknown role {role!r}; expected {', '.join(HARD_NEGATIVE_ROLES)}")
        model = clip4dm.CLIP4DM.from_pretrained(encoder, device=device, template=template,
                                                start_layer_text=start_layer_text, sorted_by="most_negative",
                                                epsilon=epsilon)
        run = run_encoder(model, encoder, bench, encoder_dir(stage_out, encoder, first=False), epsilon=epsilon,
                          batch_size=batch_size)
        add(HARD_NEGATIVE_ROLES[role], encoder, run)
        for name in bench:
            prefix = "" if name == "foil" else "nocaps_"
            for key in ("la", *ABLATION_SCORES):
                metrics[f"{prefix}{key}_{role}"] = run.metrics.get(f"{prefix}{key}")
        del model
    table = pd.DataFrame(rows)
    write_text(Path(stage_out) / "hard_negatives.csv", table.to_csv(index=False))
    return table, metrics


# ----------------------------------------------------------------------------- the attributions, launched
def attribute_profile(profile: str, encoders: Sequence[str] | None = None, consumer: str = "notebooks/03_clip4dm.ipynb"
                      ) -> dict[str, int]:
    """Every attribution notebook 03 computes for a profile (each encoder's benchmark pairs, HAT's validation copy
    included), written to the caches the notebook reads back (`encoder_dir`'s attributions.jsonl): under
    `accelerate launch` (or torchrun) each process computes its share (`runs.attribute_pairs`, sharded), and the
    notebook then recomputes nothing. Returns pairs per encoder. The command line:

        accelerate launch --multi_gpu --num_processes 4 -m lib.clip4dm.report --profile paper
    """
    sec = load_profile(profile)["03_clip4dm"]
    data = {name: data_prep.load_prepared(profile, name, consumer) for name in sec["benchmarks"]}
    for ds in data.values():
        if sec.get("max_pairs"):
            ds.records[:] = ds.records[:sec["max_pairs"]]
    val = sec.get("epsilon_from_validation")
    val_recs = data_prep.load_prepared(profile, "hat", consumer, file=val).records if val and "hat" in data else []
    pairs = benchmark_pairs(data, val_recs)
    unique = list(dict.fromkeys(p for ps in pairs.values() for p in ps))
    out, done = stage_dir(profile, "03_clip4dm"), {}
    chosen = list(encoders or sec["encoders"])
    for k, enc in enumerate(sec["encoders"]):
        if enc not in chosen:
            continue
        model = clip4dm.CLIP4DM.from_pretrained(enc, device=sec.get("device"), template=sec["template"],
                                                start_layer_text=sec["start_layer_text"], sorted_by="most_negative",
                                                epsilon=sec["epsilon"])
        runs.attribute_pairs(model, unique, encoder_dir(out, enc, first=k == 0) / "attributions.jsonl",
                             batch_size=int(sec.get("batch_size", 32)), desc=f"attribute ({enc})")
        done[enc] = len(unique)
        del model
    return done


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lib.clip4dm.report",
                                 description="notebook 03's attributions for a profile, shared over a launch's processes")
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--encoders", default=None, help="comma-separated: some of the profile's encoders")
    a = ap.parse_args(argv)
    done = attribute_profile(a.profile, a.encoders.split(",") if a.encoders else None)
    print("\n".join(f"{enc}: {n} pairs attributed or read back" for enc, n in done.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
