"""Every metric of the committed results, recomputed from the committed per-item files.

`make reproduce` copies each stage's metrics.json with the per-item files behind it to
results/<profile>/<stage>/ (lib.compendium.results.RESULT_FILES). `recompute(stage, folder)` computes the stage's
metrics again from those files alone, with the same library functions the notebook used, and
`make test` checks that they equal the committed metrics.json: a hand edit, a partial publish or
a table written from other predictions fails there.

Each metric is one of:
- recomputed: from per-item files (predictions, answers, verdicts, per-meme scores, counts);
- machine: a timing, a rate, a call or token count (it measures the machine and the cache, not the
  method; never compared);
- recorded: a number the run computed from something results/ does not keep, read from the run's own
  record (a training curve, a model's full weight vector): `RECORDED` says which and why.
`coverage` returns the keys that fall in none of these, which the test requires to be empty.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from lib.compendium.artifacts import read_json, read_jsonl
from lib.compendium.results import TIMING
from lib.trace.captioning import caption_quality_from_scores
from lib.evaluation.metrics import metrics_at, per_type_accuracy, pr_best_f1_threshold
from lib.trace import interplay as trace_interplay, probe as trace_probe, report as trace_report
from lib.clip4dm.method import _norm, average_precision
from lib.clip4dm.report import NOCAPS_DOMAIN_KEYS, pick_epsilon
from lib.clip4dm import claims as c4claims, method as clip4dm
from lib.sei.fewshot import Prediction
from lib.sei import fewshot as sei, retrieval
from lib.sei import analysis, report as rep
from lib.evaluation import textmetrics as tm
from lib.arcade.scoring import cost_summary, evaluate
from lib.arcade.report import adapted_runs, claim_frame, judge_preconditions, results_from_jsonl, seed_spread, stage_metrics
from collections import Counter
from lib.evaluation import crosseval as ce
from lib.evaluation.metrics import pairwise_mcnemar
from lib.evaluation.preconditions import retrieval_status
from lib.compendium.params import load_profile

#: stage -> function(folder of results/<profile>/<stage>/, results/<profile>/) -> recomputed metrics
RECOMPUTE: dict[str, Callable[[Path, Path], dict[str, Any]]] = {}

#: stage -> (pattern of metric keys, why the run's record is the source): numbers that need more than
#: results/ keeps (each pattern is matched in full)
RECORDED: dict[str, tuple[tuple[str, str], ...]] = {
    "models": (
        (r"(clip|vlm|nli)_.*", "the embedded models' held-out figures and training counts, computed when each was "
                               "trained (models/*/training.json: metrics; the models themselves are not committed)"),
    ),
    "serving": (
        (r"schema_.*|greedy_agreement.*|prefix_.*|max_new_tokens|n_requests",
         "a benchmark of the server on this machine: its answers are not kept (details.json keeps an example) "
         "and the last two are its parameters"),
    ),
    "03_clip4dm": (
        (r"pixels_ready|batched_max_abs_diff", "the speed benchmark on this machine (its inputs' form and the "
                                               "batched path's largest difference from one pair at a time)"),
    ),
    "02_finetuning": (
        (r".*text_train_pick_share", "the training curve's last-epoch pick share (runs/*/result.json: curve)"),
        (r".*text_mean_weight", "the mean inference weight of the meme text over every candidate; predictions "
                                "keep the selected candidate's weight only (runs/*/result.json: eval.mean_weight)"),
        (r"epochs_run|best_epoch", "the training record (runs/*/result.json: fit)"),
    ),
}


class MissingResult(FileNotFoundError):
    """A committed results file is missing; the message names it and the command that writes it."""


class _Folder:
    """A stage folder of results/ whose `/` checks that the file exists (naming `make reproduce NB=..`)."""

    def __init__(self, d: Path):
        self.d = Path(d)

    def __truediv__(self, name: str) -> Path:
        p = self.d / name
        if not p.exists() and p.with_name(p.name + ".gz").exists():     # committed gzipped (lib.compendium.results.RESULT_GZIP)
            return p.with_name(p.name + ".gz")
        if not p.exists():
            nb = self.d.name.split("_")[0] if self.d.name[:2].isdigit() else self.d.name
            raise MissingResult(f"{p} is missing: `make reproduce NB={nb}` writes it (and commits it under results/)")
        return p


def _file(d: Path) -> _Folder:
    return _Folder(d)


def stage(name: str):
    def deco(fn):
        RECOMPUTE[name] = fn
        return fn
    return deco


# ----------------------------------------------------------------------------- 00 data
@stage("00_data_prep")
def _data(d: Path, root: Path) -> dict[str, Any]:
    counts = pd.read_csv(_file(d) / "counts.csv")
    m: dict[str, Any] = {f"n_{name}": int(g.n.sum()) for name, g in counts.groupby("dataset", sort=False)}
    fhm = counts[counts.dataset == "fhm"]
    m.update({f"fhm_n_{r.split}": int(r.n) for r in fhm.itertuples()})
    if len(fhm):
        m["fhm_hateful_share"] = float(fhm.n_hateful.sum() / fhm.n.sum())
    sheet_f = d / "memeworld" / "datasheet.json"
    if sheet_f.exists():
        sheet = read_json(sheet_f)
        c = sheet["bayes_readers"]
        m.update({"text_reader_acc": c["text_only"]["overall"], "image_reader_acc": c["image_only"]["overall"],
                  "text_reader_acc_001": c["text_only"]["001"], "image_reader_acc_001": c["image_only"]["001"],
                  "text_reader_acc_110": c["text_only"]["110"], "image_reader_acc_110": c["image_only"]["110"],
                  "rule_reader_acc": sheet["rule_reader_acc_test"], "n_confounders": sheet["n_confounders"]})
    return m


# ----------------------------------------------------------------------------- 01 captioning
@stage("01_captioning")
def _captioning(d: Path, root: Path) -> dict[str, Any]:
    cap = pd.read_csv(_file(d) / "captioned.csv", dtype={"id": str})
    names = list(dict.fromkeys(cap.dataset))
    m: dict[str, Any] = {}
    for k, name in enumerate(names):
        g = cap[cap.dataset == name]
        suffix = "" if k == 0 else f"_{name}"
        m[f"n_memes{suffix}"] = len(g)
        m[f"n_unreadable{suffix}"] = int((~g.readable.astype(bool)).sum())
    if (d / "caption_scores.csv").exists():
        scores = pd.read_csv(_file(d) / "caption_scores.csv", dtype={"id": str})
        boxes = pd.read_csv(_file(d) / "box_scores.csv", dtype={"id": str})
        m.update(caption_quality_from_scores(scores, boxes))
    if (d / "interplay_check.csv").exists():                          # TRACE's interplay captioner, checked alone
        m.update(trace_interplay.check_from_items(pd.read_csv(d / "interplay_check.csv", dtype={"id": str, "type": str},
                                                              keep_default_na=False)))
    return m


# ----------------------------------------------------------------------------- 02 TRACE
def _trace_runs(d: Path, root: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every run of notebook 02 rebuilt from results/: its record (result.json) with the evaluation's
    split metrics, optimistic-threshold numbers and per-type accuracies recomputed from predictions.csv."""
    gold = pd.read_csv(_file(root / "00_data_prep") / "memes.csv", dtype={"id": str, "type": str}) \
        if (root / "00_data_prep" / "memes.csv").exists() else pd.DataFrame(columns=["id", "type"])
    types = dict(zip(gold.id, gold.type))
    runs = {}
    for run_dir in sorted((d / "runs").glob("*")):
        if not (run_dir / "result.json").exists():
            continue
        r = read_json(run_dir / "result.json")
        preds = pd.read_csv(_file(run_dir) / "predictions.csv", dtype={"id": str})
        splits = {}
        for split, g in preds.groupby("split", sort=False):
            p, y, thr = g.probability.to_numpy(float), g.label.to_numpy(int), float(g.threshold.iloc[0])
            m = metrics_at(p, y, thr)
            if len(set(y)) == 2:
                t_opt = pr_best_f1_threshold(p, y)
                m["accuracy_optimistic_threshold_on_test"] = metrics_at(p, y, t_opt)["accuracy"]
                m["macro_f1_optimistic_threshold_on_test"] = metrics_at(p, y, t_opt)["macro_f1"]
            splits[split] = m
        r["eval"]["splits"] = splits
        r["eval"]["predictions"] = preds.to_dict("records")
        per_split = "test_seen" if "test_seen" in splits else next(iter(splits), "test")
        r["eval"]["per_type"] = per_type_accuracy([p for p in r["eval"]["predictions"] if p["split"] == per_split],
                                                  types, with_n=True)
        r["dir"] = str(run_dir)
        runs[run_dir.name] = r
    return runs, types


@stage("02_finetuning")
def _trace(d: Path, root: Path) -> dict[str, Any]:
    runs, types = _trace_runs(d, root)
    variants = read_json(_file(d) / "variants.json")                  # variant name -> run folder (the first seed)
    by_name = {name: runs[folder] for name, folder in variants.items()}
    seeds = pd.read_csv(_file(d) / "seeds.csv")
    first = {folder: name for name, folder in variants.items()}
    rows = []
    for folder, r in runs.items():
        cfg = read_json(_file(d) / "runs" / folder / "config.json")["config"]
        base = first.get(folder) or next((n for n, f in variants.items() if folder.startswith(f + "_seed")), None)
        if base is None or (folder not in first and f"{variants[base]}_seed{cfg['seed']}" != folder):
            continue
        ts = r["eval"]["splits"]["test_seen"]
        rows.append({"variant": base, "seed": cfg["seed"], "accuracy": ts["accuracy"], "auroc": ts["auroc"],
                     "macro_f1": ts["macro_f1"],
                     "acc_type_001": r["eval"]["per_type"].get("001", (float("nan"), 0))[0],
                     "unseen_accuracy": r["eval"]["splits"].get("test_unseen", {}).get("accuracy", float("nan"))})
    seed_tab = pd.DataFrame(rows)
    # the committed seeds table is the one these runs give (same rows, same numbers)
    merged = seeds.merge(seed_tab, on=["variant", "seed"], suffixes=("", "_again"))
    if len(merged) != len(seeds) or len(seed_tab) != len(seeds):
        raise ValueError(f"{d}/seeds.csv has {len(seeds)} rows; the committed runs give {len(seed_tab)}")
    for col in ("accuracy", "auroc", "macro_f1", "acc_type_001", "unseen_accuracy"):
        a, b = merged[col].to_numpy(float), merged[f"{col}_again"].to_numpy(float)
        if not np.allclose(a, b, atol=1e-9, equal_nan=True):
            raise ValueError(f"{d}/seeds.csv: column {col} differs from the committed runs' predictions")
    default = next(iter(variants))
    mo = {}
    for folder, r in runs.items():
        if folder.startswith("multioff_") and "test" in r["eval"]["splits"]:
            tag = folder.split("_", 2)[-1]
            prefix = "multioff_no_con_" if tag.endswith("no_con") else "multioff_"
            m = r["eval"]["splits"]["test"]
            mo.update({f"{prefix}macro_f1": m["macro_f1"], f"{prefix}accuracy": m["accuracy"],
                       f"{prefix}auroc": m["auroc"],
                       f"{prefix}accuracy_optimistic_threshold_on_test": m["accuracy_optimistic_threshold_on_test"]})
            y = np.array([p["label"] for p in r["eval"]["predictions"]])
            mo["multioff_majority_accuracy"] = float(max(y.mean(), 1 - y.mean()))
    out = trace_report.stage_metrics(by_name, default, {"cached": float("nan"), "uncached": float("nan")},
                                     seed_tab, bool(types), mo)
    items = next((f for f in (d / "probe_items.csv", d / "probe_items.csv.gz") if f.exists()), None)
    if items is not None:                                             # the captions' gain in a linear probe
        out.update(trace_probe.probe_metrics(pd.read_csv(items, dtype={"id": str})))
    return {k: v for k, v in out.items() if not k.startswith("epoch_s")}


# ----------------------------------------------------------------------------- 03 CLIP4DM
def _foil_table(f: Path) -> pd.DataFrame:
    return pd.read_csv(f, dtype={"foil_word": str, "negative_word": str, "domain": str}, keep_default_na=False)


def _foil_metrics(t: pd.DataFrame) -> dict[str, float]:
    """FOIL / nocaps-FOIL metrics from a results_<benchmark>.csv table (one row per pair, most_negative)."""
    foil = t[t.is_foil.astype(str) == "True"]
    pos = pd.to_numeric(foil.foil_position, errors="coerce")
    low = pd.to_numeric(foil.lowest_word_position, errors="coerce")
    orig = (t.is_foil.astype(str) != "True").tolist()
    chance = {}
    if "n_words" in t:
        chance = {"la_chance": float(np.mean([1.0 / max(1, int(n)) for n in foil.n_words])) if len(foil) else float("nan"),
                  "la_chance_content": float(np.mean([1.0 / max(1, int(n)) for n in foil.n_content_words]))
                  if len(foil) else float("nan"),
                  "n_repeated_foil_word": int(foil.foil_word_repeated.astype(str).eq("True").sum())}
    return {**chance, "la": float(np.mean((low == pos) & low.notna())) if len(foil) else float("nan"),
            "la_official_string": float(np.mean([bool(n) and _norm(n) == _norm(w)
                                                 for n, w in zip(foil.negative_word, foil.foil_word)])),
            "ap_clipscore": average_precision(t.clip_score.astype(float).tolist(), orig),
            "ap_neg_attribution": average_precision(t.sum_negative_attribution.astype(float).tolist(), orig),
            "ap_fclipscore": average_precision(t.f_clipscore.astype(float).tolist(), orig)}


@stage("03_clip4dm")
def _clip4dm(d: Path, root: Path) -> dict[str, Any]:
    m: dict[str, Any] = {}
    roles = {"": d}
    hn = d / "hard_negatives.csv"
    if hn.exists():                       # the hard-negative ablation's leak-free encoders: a folder each
        for sub in sorted(x for x in d.iterdir() if x.is_dir() and (x / "results_foil.csv").exists()):
            roles["_no_hard_negatives" if sub.name.endswith("nohn") else "_leak_free"] = sub
    for suffix, folder in roles.items():
        for bench, prefix in (("foil", ""), ("nocaps_foil", "nocaps_")):
            f = folder / f"results_{bench}.csv"
            if f.exists():
                m.update({f"{prefix}{k}{suffix}": v for k, v in _foil_metrics(_foil_table(f)).items()
                          if not (suffix and k in ("la_official_string", "la_chance", "la_chance_content",
                                                   "n_repeated_foil_word"))})
    f = d / "results_nocaps_foil.csv"
    if f.exists():
        t = _foil_table(f)
        for dom, short in NOCAPS_DOMAIN_KEYS.items():
            g = t[t.domain == dom]
            if len(g):
                part = _foil_metrics(g)
                m.update({f"nocaps_la_{short}": part["la"], f"nocaps_ap_fclipscore_{short}": part["ap_fclipscore"],
                          f"nocaps_ap_clipscore_{short}": part["ap_clipscore"]})
    eps = float(read_json(_file(d) / "settings.json")["epsilon"])
    if (d / "epsilon_sweep.csv").exists():
        sw = pick_epsilon(pd.read_csv(d / "epsilon_sweep.csv").drop(columns=["within_tie", "chosen"], errors="ignore"))
        row = sw[sw["chosen"]].iloc[0]
        m.update({"epsilon_chosen": float(row["epsilon"]), "epsilon_val_share_abstaining": float(row["share_abstaining"]),
                  "epsilon_val_word_f1": float(row["word_f1"])})
        eps = m["epsilon_chosen"]
    m.update(_threshold_metrics(d, eps))
    nli = root / "models" / "memeworld-nli" / "training.json"
    if nli.exists() and "nli_heldout_acc" in read_json(nli).get("metrics", {}):
        m["nli_heldout_acc"] = read_json(nli)["metrics"]["nli_heldout_acc"]
    if (d / "claims.csv").exists():       # the claims and their oracle controls, from the same per-caption results
        tests = pd.read_csv(d / "claims.csv")["test"].astype(str)
        draws = re.search(r"\((\d+) resamples", tests.iloc[0]) if len(tests) else None
        m.update(c4claims.claim_metrics(c4claims.claim_table(d, resamples=int(draws.group(1)) if draws else
                                                             c4claims.RESAMPLES)))
    return {k: v for k, v in m.items() if v is not None}


@dataclass
class _PairRecord:
    """What the threshold benchmarks' scoring reads of a record, rebuilt from its results row."""
    caption: str
    misaligned_words: list
    misaligned_positions: list
    score: float | None
    token_labels: None = None

    @property
    def is_foil(self) -> bool:
        return bool(self.misaligned_words)


def _threshold_metrics(d: Path, eps: float) -> dict[str, Any]:
    """HAT, RichHF and SeeTRUE from their results tables: each pair's stored attributions selected again at
    the chosen epsilon (clip4dm.select) and scored by the library's own functions; SeeTRUE's NLI scores per
    caption as written (the NLI model is not rerun)."""
    m: dict[str, Any] = {}
    for bench in ("hat", "richhf", "seetrue"):
        f = d / f"results_{bench}.csv"
        if not f.exists() and f.with_name(f.name + ".gz").exists():
            f = f.with_name(f.name + ".gz")
        if not f.exists():
            continue
        t = pd.read_csv(f, keep_default_na=False, dtype={"misaligned": str, "caption": str})
        res = [clip4dm.select(json.loads(a), "threshold", eps) for a in t.attribution]
        recs = [_PairRecord(c, (mis.split() if bench != "seetrue" else [mis]) if mis else [], json.loads(pos),
                            float(sc) if sc not in ("", None) else None)
                for c, mis, pos, sc in zip(t.caption, t.misaligned, t.misaligned_positions, t.score)]
        if bench == "hat":
            m.update(clip4dm.evaluate_hat(res, recs, eps))
        elif bench == "richhf":
            m.update(clip4dm.evaluate_richhf(res, recs, eps))
        else:
            per = pd.to_numeric(t.nli_score, errors="coerce").to_numpy(float) if "nli_score" in t else None
            st = clip4dm.evaluate_seetrue(res, recs, eps, None, per_caption=per)
            m["seetrue_share_with_phrase"] = st["seetrue_share_with_phrase"]
            if per is not None:
                m["seetrue_nli_score"] = st["seetrue_nli"]
                m["seetrue_nli_oracle"] = float(np.nanmean(pd.to_numeric(t.nli_oracle, errors="coerce")))
                m["seetrue_nli_random_word"] = float(np.nanmean(pd.to_numeric(t.nli_random_word, errors="coerce")))
    return m


# ----------------------------------------------------------------------------- 04 few-shot
def _fewshot_predictions(d: Path) -> dict[str, list]:
    by: dict[str, list] = {}
    for r in read_jsonl(_file(d) / "predictions_fhm.jsonl"):
        by.setdefault(r["setting"], []).append(Prediction(**{k: v for k, v in r.items() if k != "model"}))
    return by


@stage("04_few_shot")
def _fewshot(d: Path, root: Path) -> dict[str, Any]:
    settings = read_json(_file(d) / "settings.json")
    retriever = settings["retrievers"][0]
    main = sei.main_setting_name(settings["retrievers"], settings["shots"])
    by = _fewshot_predictions(d)
    results = read_json(_file(d) / "results.json")
    # every setting's classification, label-following and generated texts' scores, again from its answers
    # and the references they were scored against (references_fhm.json)
    refs = read_json(_file(d) / "references_fhm.json")
    bs = tm.BertScoreSpec(model=settings["bertscore"]["model"], layers=int(settings["bertscore"]["layers"]),
                          proxy=bool(settings["bertscore"].get("proxy", False)))
    for name, preds in by.items():
        results[name] = {**results[name], **sei.classification(preds), **analysis.exemplar_label_following(preds),
                         **sei.generation_scores(preds, refs["explanation"], refs["intervention"],
                                                 settings["semsim_model"], bertscore=bs,
                                                 stemmer=settings["rouge_stemmer"])}
    # the label vote of the retrieved exemplars (no model) and the retrieval's agreement: from the saved
    # ranking and the gold labels and types of the pool (the train split)
    gold = pd.read_csv(_file(root / "00_data_prep") / "memes.csv", dtype={"id": str, "type": str})
    label, mtype = dict(zip(gold.id, gold.label)), dict(zip(gold.id, gold.type))
    ranking = read_json(_file(d) / f"exemplars_fhm_{retriever.replace('/', '_')}.json")
    knn_n = int(settings["knn_n"])
    queries = [sei.Meme(q, "", "", int(label[q]), type=mtype.get(q)) for q in ranking]
    pool = [sei.Meme(i, "", "", int(y), type=t) for i, y, t, sp in zip(gold.id, gold.label, gold.type, gold.split)
            if sp == settings["train_split"]]
    index = {m.id: k for k, m in enumerate(pool)}
    ranked = np.array([[index[e] for e, _ in row] for row in ranking.values()])
    knn = rep.knn_predictions(ranked[:, :knn_n], pool, queries)
    results["knn_vote"] = {**results.get("knn_vote", {}), **sei.classification(knn), "calls": 0}
    quality = pd.DataFrame([{"dataset": "fhm", "retriever": retriever,
                             **retrieval.retrieval_quality(ranked[:, :n], pool, queries)}
                            for n in sorted(set(settings["shots"]) | {knn_n})])
    knns = {retriever: knn}                      # every retriever's exemplars' label vote: each claim's baseline
    for r in settings["retrievers"][1:]:
        f = _file(d) / f"exemplars_fhm_{r.replace('/', '_')}.json"
        if f.exists():
            rk = read_json(f)
            qs = [sei.Meme(q, "", "", int(label[q]), type=mtype.get(q)) for q in rk]
            knns[r] = rep.knn_predictions(np.array([[index[e] for e, _ in row] for row in rk.values()])[:, :knn_n],
                                          pool, qs)
    first = {p.id for p in by.get("zero_shot", [])} or None       # the memes the run first answered (the plan's n)
    claims, cold = rep.claim_frame({**by, "knn_vote": knn}, main, retriever, spread=True,
                                   others=settings["retrievers"][1:], preconditions=retrieval_status(root),
                                   first_items=first, knn=knns)
    rows3 = rep.table3_rows(read_jsonl(_file(d) / "agent_outputs.jsonl"), settings["semsim_model"], bs)
    committed = read_json(_file(d) / "metrics.json")
    maj = max(np.mean([q.label for q in queries]), 1 - np.mean([q.label for q in queries]))

    def row(name):
        return results.get(name) or {}
    out = rep.stage_metrics(results, row, main, maj, quality, retriever, knn_n, "fhm", rows3,
                            "expl_bertscore_f1_proxy" in committed, committed.get("rerun_calls", 0), claims, cold)
    if (_file(d) / "predictions_adapted.jsonl").exists():      # the adapted moderator and its control (lib.sei.adapt)
        ad: dict[str, dict[str, list]] = {}
        for r in read_jsonl(_file(d) / "predictions_adapted.jsonl"):
            ad.setdefault(r["role"], {}).setdefault(r["setting"], []).append(
                Prediction(**{k: v for k, v in r.items() if k not in ("model", "role")}))
        ad_claims = rep.claim_frame({**ad.get("model", {}), "knn_vote": knn}, main, retriever,
                                    preconditions=retrieval_status(root), tag=rep.ADAPTED_MODERATOR_TAG,
                                    first_items=first, knn=knns)
        out.update(rep.adapted_metrics(ad, read_json(_file(d) / "adapted.json")["training"], ad_claims))
    return out


# ----------------------------------------------------------------------------- 05 debate
@stage("05_debate")
def _debate(d: Path, root: Path) -> dict[str, Any]:
    settings = read_json(_file(d) / "settings.json")
    runs = {}
    for f in sorted(d.glob("eval_*.json")):
        name = f.stem[len("eval_"):]
        ev = read_json(f)
        res = results_from_jsonl(_file(d) / f"results_{name}.jsonl")
        cm = ev["config"]["class_mode"]
        runs[name] = {"name": name, "config": ev["config"], "results": res,
                      "official": evaluate(res, cm, "official"), "corrected": evaluate(res, cm, "corrected"),
                      "cost": cost_summary(res, ev["config"]["rounds"])}
    main = runs.get("arcade") or next(iter(runs.values()))
    gts = [r.gt for r in main["results"]]
    chance = Counter(gts).most_common(1)[0][1] / len(gts)
    claims, cold = claim_frame(runs, settings["class_mode"], spread=True, precondition=judge_preconditions(root))
    ad = adapted_runs(runs, "_adapted")                # the adapted judge's runs (notebook 05's `adapted_judge`)
    ad_claims = (claim_frame(ad, settings["class_mode"], suffix="_adapted", tag=" (adapted judge)",
                             precondition=judge_preconditions(root, "_adapted")) if ad else None)
    committed = read_json(_file(d) / "metrics.json")
    return stage_metrics(runs, chance, committed.get("rerun_calls", 0), claims, seed_spread(runs), cold, ad_claims)


# ----------------------------------------------------------------------------- 06 evaluation
@stage("06_evaluation")
def _evaluation(d: Path, root: Path) -> dict[str, Any]:
    preds = pd.read_csv(_file(d) / "predictions_common.csv", dtype={"id": str})
    gold = pd.read_csv(_file(root / "00_data_prep") / "memes.csv", dtype={"id": str, "type": str})
    gold = gold[gold.split.str.startswith("test")].set_index("id")
    p = load_profile(root.name)["06_evaluation"]            # the run's parameters (results/<profile>/: its name)
    methods = {name: {"frame": g.drop(columns=["method", "system"]).reset_index(drop=True), "system": g.system.iloc[0]}
               for name, g in preds.groupby("method", sort=False)}
    common = read_json(_file(d) / "common.json")["ids"]
    kw = dict(n_resamples=p["n_resamples"], seed=p["seed"], confidence=p["confidence"], ci_method=p["ci_method"])
    table = ce.long_table(methods, gold, common, "common", **kw)
    majority = max(gold.loc[common, "label"].mean(), 1 - gold.loc[common, "label"].mean())
    correct = ce.correct_matrix(methods, common)
    pairs = pairwise_mcnemar({m: correct[m].to_numpy(bool) for m in correct}, correction=p["correction"],
                             alpha=p["alpha"])
    items = pd.read_csv(_file(d) / "injection_predictions.csv", dtype={"id": str, "source_id": str})
    rows = ce.FlipRows(dict(zip(items.id, items.copies)), p["n_resamples"], p["seed"], p["confidence"],
                       source_of=dict(zip(items.id, items.source_id)))
    for (method, family, mitigation), g in items.groupby(["method", "family", "mitigation"], sort=False):
        rows.add(method, family, g.original.tolist(), g.injected.tolist(), g.id.tolist(), mitigation)
    flips = rows.frame()
    committed = read_json(_file(d) / "metrics.json")
    return ce.stage_metrics(table, len(methods), len(common), majority, pairs, committed.get("n_injected_llm", 0),
                            committed.get("n_injected_trace", 0), committed.get("llm_calls", 0), flips)


# ----------------------------------------------------------------------------- the check
def recompute(stage_name: str, folder: Path, root: Path | None = None) -> dict[str, Any]:
    """The stage's metrics recomputed from its committed files (`root`: the profile's results folder)."""
    return RECOMPUTE[stage_name](Path(folder), Path(root or Path(folder).parent))


def is_machine(key: str) -> bool:
    return bool(TIMING.search(key))


def recorded_reason(stage_name: str, key: str) -> str | None:
    return next((why for pat, why in RECORDED.get(stage_name, ()) if re.fullmatch(pat, key)), None)


def coverage(stage_name: str, committed: dict[str, Any], again: dict[str, Any]) -> list[str]:
    """Committed metrics that are neither recomputed, nor machine measures, nor recorded with a reason."""
    return [k for k in committed if k not in again and not is_machine(k) and recorded_reason(stage_name, k) is None]


def mismatches(committed: dict[str, Any], again: dict[str, Any], rel: float = 1e-6) -> list[str]:
    """Recomputed metrics that differ from the committed ones (metrics.json rounds floats to 6 decimals)."""
    out = []
    for k, v in again.items():
        if k not in committed or is_machine(k):
            continue
        c = committed[k]
        if isinstance(v, (bool, str)) or isinstance(c, (bool, str)) or v is None or c is None:
            same = v == c
        else:
            a, b = float(c), float(v)
            same = (np.isnan(a) and np.isnan(b)) or abs(a - b) <= max(1e-6, rel * abs(a))
        if not same:
            out.append(f"{k}: committed {c!r}, recomputed {v!r}")
    return out
