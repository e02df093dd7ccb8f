"""Notebook 06's steps: every system's predictions read back from its artifacts into one shape,
the memes they have in common, and the long-format table with bootstrap CIs.

One prediction frame per method: columns id, label (binary gold: 1 = hateful), prediction (0/1,
NaN when the method gave no usable answer), score (a probability where the method has one, for
AUROC). The debate's multiclass verdicts are read as binary (any hate category = hateful), the
few-shot and debate labels have no score.

    gold = gold_table(profile)                              # id -> split, type, difficulty, confounders
    methods = {**trace_methods(profile), **fewshot_methods(profile), **debate_methods(profile)}
    rows = long_table(methods, gold, common_ids, ...)       # method x subset x metric, with CIs
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from PIL import Image

from lib.compendium.artifacts import declared, read_jsonl
from lib.data import prep as data_prep
from lib.data.prep import load_prepared
from lib.arcade.report import court_config, run_variant as run_court
from lib.data.injection import mitigate
from lib.evaluation.metrics import flip_rate, metric_rows

#: system of each method family (the table's first column)
SYSTEMS = {"trace": "TRACE", "fewshot": "See, Explain, Intervene", "debate": "ARCADE"}


def _frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    f = pd.DataFrame(rows, columns=["id", "label", "prediction", "score"])
    f["id"] = f["id"].astype(str)
    f["prediction"] = f["prediction"].astype(float)
    f["score"] = f["score"].astype(float)
    return f.drop_duplicates("id").reset_index(drop=True)


def gold_table(profile: str) -> pd.DataFrame:
    """One row per test meme: id, split, label, and where known type (SMI interaction type),
    difficulty, confounder_kind / confounder_of (MemeWorld's generator; the H-VLI files give type
    and difficulty for real memes they share with FHM)."""
    mw = declared(profile, "memeworld") / "memeworld.jsonl"
    if mw.exists():
        g = data_prep.gold_table(profile)
        return g[g.split.str.startswith("test")].set_index("id")
    nb = "notebooks/06_evaluation.ipynb"
    fhm = [r for r in load_prepared(profile, "fhm", nb).records if r.split.startswith("test")]
    g = pd.DataFrame([{"id": str(r.id), "split": r.split, "label": int(r.label), "type": None, "difficulty": None,
                       "confounder": None} for r in fhm]).set_index("id")
    try:
        hv = load_prepared(profile, "hvli", nb).records
    except Exception:                                   # no H-VLI files: types stay unknown
        hv = []
    by_stem = {Path(r.img_path).stem: r for r in hv}
    for i in g.index:
        r = by_stem.get(i) or by_stem.get(f"{int(i):05d}" if i.isdigit() else i)
        if r is not None:
            g.loc[i, ["type", "difficulty"]] = [r.meta["type"], r.meta["difficulty"]]
    return g


def trace_methods(profile: str, dataset: str = "fhm") -> dict[str, dict[str, Any]]:
    """Every finished TRACE variant of notebook 02 on `dataset` (runs/<dataset>_<backbone>_<variant>):
    name -> {system, family, frame, run_dir}. The variants are those notebook 02 names in
    `variants.json` when it lists runs of `dataset`; seed replicates (`*_seed<N>`, read through
    `seeds.csv`) are never methods of their own."""
    runs, listed = declared(profile, "trace_runs"), declared(profile, "trace_variants")
    named = set(json.loads(listed.read_text()).values()) if listed.exists() else set()
    named = {n for n in named if n.startswith(f"{dataset}_")}
    out = {}
    for d in sorted(runs.glob(f"{dataset}_*")) if runs.exists() else []:
        if (named and d.name not in named) or re.search(r"_seed\d+$", d.name):
            continue
        pred = d / "predictions.csv"
        if not (pred.exists() and (d / "result.json").exists()):
            continue
        p = pd.read_csv(pred, dtype={"id": str})
        name = "TRACE " + d.name[len(dataset) + 1:]
        out[name] = {"system": SYSTEMS["trace"], "family": "trace", "run_dir": d,
                     "frame": _frame([{"id": r.id, "label": r.label, "prediction": r.prediction, "score": r.probability}
                                      for r in p.itertuples()]),
                     "selected": p.set_index("id")[["selected", "selected_weight"]]}
    return out


def fewshot_frame(preds: Sequence[Any]) -> pd.DataFrame:
    """Frame of few-shot predictions (sei.Prediction or their JSON): no label -> no answer."""
    rows = []
    for p in preds:
        d = p if isinstance(p, dict) else p.__dict__
        lab = d.get("label")
        rows.append({"id": d["id"], "label": int(d["gold"]), "prediction": np.nan if lab is None else int(lab),
                     "score": np.nan})
    return _frame(rows)


def fewshot_methods(profile: str, dataset: str = "fhm") -> dict[str, dict[str, Any]]:
    """Notebook 04's predictions (predictions_<dataset>.jsonl): one method per setting."""
    f = declared(profile, "sei_predictions", dataset=dataset)
    if not f.exists():
        return {}
    by: dict[str, list[dict[str, Any]]] = {}
    for r in read_jsonl(f):
        by.setdefault(r["setting"], []).append(r)
    return {f"few-shot {s}": {"system": SYSTEMS["fewshot"], "family": "fewshot", "setting": s,
                              "frame": fewshot_frame(rows)} for s, rows in by.items()}


def debate_frame(results: Sequence[Any]) -> pd.DataFrame:
    """Binary frame of debate results (SampleResult or their JSON): hateful = any hate category."""
    rows = []
    for r in results:
        d = r if isinstance(r, dict) else r.to_json()
        lab = d.get("label", -1)
        rows.append({"id": d["id"], "label": int(d["gt"] > 0), "score": np.nan,
                     "prediction": np.nan if lab is None or lab < 0 else int(lab > 0)})
    return _frame(rows)


def debate_methods(profile: str, variants: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Notebook 05's results_<variant>.jsonl (the rerun check left out)."""
    pattern = declared(profile, "debate_results", variant="*")
    out = {}
    for f in sorted(pattern.parent.glob(pattern.name)) if pattern.parent.exists() else []:
        v = f.stem[len("results_"):]
        if v == "rerun_check" or (variants is not None and v not in variants):
            continue
        res = read_jsonl(f)
        out[f"debate {v}"] = {"system": SYSTEMS["debate"], "family": "debate", "variant": v, "frame": debate_frame(res),
                              "results": res}
    return out


def subsets_for(gold: pd.DataFrame, ids: Sequence[str]) -> dict[str, list[str]]:
    """Named subsets of `ids`: all, each split, each interaction type and each difficulty (where known)."""
    g = gold.loc[[i for i in ids if i in gold.index]]
    out = {"all": list(g.index)}
    for col, prefix in (("split", ""), ("type", "type "), ("difficulty", "difficulty ")):
        if col in g and g[col].notna().any():
            for v, sub in g.groupby(col):
                out[f"{prefix}{v}"] = list(sub.index)
    return out


def long_table(methods: dict[str, dict[str, Any]], gold: pd.DataFrame, ids: Sequence[str] | None = None,
               set_name: str = "common", n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95,
               ci_method: str = "percentile") -> pd.DataFrame:
    """Method x subset x metric with bootstrap CIs on `ids` (None: each method's own memes). A
    method missing some of `ids` is an error: the common set is common."""
    rows = []
    for name, m in methods.items():
        f = m["frame"]
        if ids is not None:
            missing = sorted(set(ids) - set(f["id"]))
            if missing:
                raise ValueError(f"{name} has no prediction for {len(missing)} of the {set_name} memes "
                                 f"(first: {missing[:3]})")
            f = f.set_index("id").loc[list(ids)].reset_index()
        subs = subsets_for(gold, list(f["id"]))
        rows += metric_rows(f, name, subs, n_resamples=n_resamples, seed=seed, confidence=confidence,
                            method_ci=ci_method, system=m["system"], memes=set_name)
    cols = ["system", "method", "memes", "subset", "metric", "value", "ci_low", "ci_high", "n"]
    return pd.DataFrame(rows)[cols]


def correct_matrix(methods: dict[str, dict[str, Any]], ids: Sequence[str]) -> pd.DataFrame:
    """memes x methods: 1 where the method's answer is right (no answer: wrong)."""
    out = {}
    for name, m in methods.items():
        f = m["frame"].set_index("id").loc[list(ids)]
        out[name] = (f["prediction"] == f["label"]).astype(int)
    return pd.DataFrame(out, index=list(ids))


def headline(table: pd.DataFrame, metric: str = "accuracy", subset: str = "all") -> pd.DataFrame:
    """One row per method: value [low, high] (n) of one metric on one subset."""
    t = table[(table.metric == metric) & (table.subset == subset)].copy()
    t["ci"] = [f"[{lo:.3f}, {hi:.3f}]" for lo, hi in zip(t.ci_low, t.ci_high)]
    return t.set_index(["system", "method"])[["value", "ci", "n"]]


# ----------------------------------------------------------------------------- figures (06 and 07 draw them from the CSVs)
def short_name(name: str) -> str:
    """A method's name as figures and tables label it."""
    return name.replace("TRACE memeworld-clip_", "TRACE ").replace("memeworld-clip", "mwclip")


def plot_forest(table: pd.DataFrame, metric: str = "accuracy", chance: float | None = None, title: str = ""):
    """Each method's `metric` with its CI: the common memes (filled) beside each method's own
    memes (open), one row per method, grouped by system."""
    import matplotlib.pyplot as plt
    t = table[(table.metric == metric) & (table.subset == "all")]
    methods = list(dict.fromkeys(t.method))
    fig, ax = plt.subplots(figsize=(8, 0.36 * len(methods) + 1.3))
    colors = {s: c for s, c in zip(dict.fromkeys(t.system), plt.get_cmap("tab10").colors)}
    for k, (memes, marker, dy) in enumerate((("common", "o", -0.15), ("own", "s", 0.15))):
        sub = t[t.memes == memes]
        for _, r in sub.iterrows():
            y = methods.index(r.method) + dy
            ax.errorbar([r.value], [y], xerr=[[r.value - r.ci_low], [r.ci_high - r.value]], fmt=marker,
                        color=colors[r.system], mfc=colors[r.system] if memes == "common" else "white", capsize=3, ms=5)
            ax.annotate(f"n={r.n}", (r.ci_high, y), textcoords="offset points", xytext=(4, -3), fontsize=7)
    ax.set_yticks(range(len(methods)), [short_name(m) for m in methods], fontsize=8)
    ax.invert_yaxis()
    if chance is not None:
        ax.axvline(chance, ls="--", color="grey", lw=1)
    ax.set_xlim(-0.02, 1.1)
    ax.set_xlabel(f"{metric} (95% bootstrap CI)")
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], marker="o", ls="", color="k", label="common memes"),
               Line2D([], [], marker="s", ls="", color="k", mfc="white", label="the method's own memes")]
    handles += [Line2D([], [], marker="o", ls="", color=c, label=s) for s, c in colors.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def plot_type_heatmap(table: pd.DataFrame, memes: str = "common", title: str = ""):
    """Accuracy per interaction type (columns, with n) for every method (rows)."""
    import matplotlib.pyplot as plt
    t = table[(table.metric == "accuracy") & (table.memes == memes) & table.subset.str.startswith("type ")]
    piv = t.pivot_table(index="method", columns="subset", values="value", sort=False)
    ns = t.groupby("subset")["n"].max()
    fig, ax = plt.subplots(figsize=(1.0 * piv.shape[1] + 3.5, 0.36 * piv.shape[0] + 1.4))
    im = ax.imshow(piv.to_numpy(float), vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.grid(False)
    for i in range(piv.shape[0]):
        for j in range(piv.shape[1]):
            v = piv.iat[i, j]
            if v == v:
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(piv.shape[1]), [f"{c[5:]}\nn={ns[c]}" for c in piv.columns], fontsize=8)
    ax.set_yticks(range(piv.shape[0]), [short_name(m) for m in piv.index], fontsize=8)
    ax.set_xlabel("interaction type (text, image, final)")
    fig.colorbar(im, ax=ax, fraction=0.03, label="accuracy")
    ax.set_title(title, fontsize=10)
    return fig


def plot_mcnemar(pairs: pd.DataFrame, title: str = ""):
    """Adjusted McNemar p-value of every pair of methods (lower triangle); significant pairs starred."""
    import matplotlib.pyplot as plt
    names = list(dict.fromkeys(list(pairs.a) + list(pairs.b)))
    M = np.full((len(names), len(names)), np.nan)
    for _, r in pairs.iterrows():
        i, j = names.index(r.a), names.index(r.b)
        M[max(i, j), min(i, j)] = r.p_adjusted
    fig, ax = plt.subplots(figsize=(0.5 * len(names) + 3, 0.45 * len(names) + 1.5))
    im = ax.imshow(-np.log10(np.clip(M, 1e-12, 1)), cmap="viridis", vmin=0, vmax=4)
    ax.grid(False)
    for _, r in pairs.iterrows():
        i, j = names.index(r.a), names.index(r.b)
        if r.significant:
            ax.text(min(i, j), max(i, j), "*", ha="center", va="center", color="white", fontsize=12)
    ax.set_xticks(range(len(names)), [short_name(n) for n in names], rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), [short_name(n) for n in names], fontsize=7)
    fig.colorbar(im, ax=ax, fraction=0.03, label="-log10 adjusted p")
    ax.set_title(title, fontsize=10)
    return fig


def plot_flips(flips: pd.DataFrame, title: str = ""):
    """Injection flip rate with its CI per method (rows): instruction copies red, the neutral
    control grey, mitigated runs green."""
    import matplotlib.pyplot as plt
    f = flips.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(f) + 1.2))
    for k, r in f.iterrows():
        c = "tab:grey" if r.get("copies") == "control" else \
            "tab:green" if r.get("mitigation", "none") != "none" else "tab:red"
        if r.flip_rate == r.flip_rate:
            ax.errorbar([r.flip_rate], [k], xerr=[[r.flip_rate - r.ci_low], [r.ci_high - r.flip_rate]], fmt="o",
                        color=c, capsize=3)
        ax.annotate(f"{r.n_called_hateful} called hateful of {r.n_pairs}", (1.02, k), fontsize=7, va="center",
                    annotation_clip=False)
    ax.set_yticks(range(len(f)), [f"{short_name(m)}" + (f" + {g}" if g != "none" else "") + (" (control)" if c == "control" else "")
                                  for m, g, c in zip(f.method, f.get("mitigation", ["none"] * len(f)),
                                                     f.get("copies", ["instruction"] * len(f)))], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.0)
    ax.set_xlabel("flip rate: hateful before the instruction, non-hateful after (95% CI)")
    ax.set_title(title, fontsize=10)
    return fig


def hvli_to_fhm(hvli_records: Sequence[Any], fhm_records: Sequence[Any]) -> dict[str, str]:
    """H-VLI sample id -> FHM id for the H-VLI samples whose image is an FHM meme (matched by the
    image file's name, the one thing the two releases share); MemeWorld writes both with one id."""
    by_name = {Path(r.img_path).name: str(r.id) for r in fhm_records}
    return {str(h.id): by_name[Path(h.img_path).name] for h in hvli_records if Path(h.img_path).name in by_name}


def rekey(method: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """A method whose frame's ids are mapped (ids without a mapping are dropped)."""
    f = method["frame"]
    f = f[f["id"].isin(list(mapping))].assign(id=lambda x: x["id"].map(mapping)).reset_index(drop=True)
    return {**method, "frame": f}


# ----------------------------------------------------------------------------- notebook 06's steps
def fewshot_on(fs, memes: dict[str, Any], ids: Sequence[str], settings: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Notebook 04's moderator (`fs`, a FewShotModerator) on the memes `ids`, one method per
    setting ("main": 04's main row), with a line per setting on how many answers parsed."""
    out = {}
    for s in settings:
        name = fs.main_setting() if s == "main" else s
        preds = fs.predict([memes[i] for i in ids], name)
        out[f"few-shot {name}"] = {"system": SYSTEMS["fewshot"], "family": "fewshot", "setting": name,
                                   "frame": fewshot_frame(preds), "preds": preds}
        print(f"few-shot {name}: {sum(p.status == 'ok' for p in preds)} of {len(preds)} answers parsed")
    return out


def error_gallery(worst: pd.Series, memes: dict[str, Any], gold: pd.DataFrame, selected: pd.DataFrame,
                  caption_of, clip4dm, epsilon: float, correct: pd.DataFrame) -> list[dict[str, Any]]:
    """The memes most methods get wrong (`worst`: id -> share of methods wrong), each with its
    type and label, the caption TRACE's default model selected (and its weight), the VLM
    caption, the caption words CLIP4DM finds the image does not support (attribution below
    `epsilon`) and the methods that got it wrong. `caption_of(id)`: the VLM caption."""
    rows = []
    for i in worst.index:
        cap = caption_of(i)
        with Image.open(memes[i].img_path) as im:
            att = clip4dm(im.convert("RGB"), cap)
        rows.append({"id": i, "img": str(memes[i].img_path), "type": gold.loc[i, "type"],
                     "label": int(gold.loc[i, "label"]), "share wrong": round(float(worst[i]), 2),
                     "text": memes[i].ocr,
                     "TRACE selected": f"{selected.loc[i, 'selected']} ({selected.loc[i, 'selected_weight']:.2f})",
                     "VLM caption": cap,
                     "unsupported words (CLIP4DM)": ", ".join(f"{w} {s:+.3f}" for w, s in att["all_word_attributions"]
                                                              if s < epsilon) or "none",
                     "wrong": ", ".join(short_name(m) for m in correct.columns if not correct.loc[i, m])})
    return rows


class FlipRows:
    """The rows of injection.csv: one per method, kind of copy (instruction or control) and
    mitigation, each a flip rate with its interval (lib.evaluation.metrics.flip_rate). `source_of`: injected
    copy id -> the id of the meme it was made from; several copies of one meme are resampled
    together (a cluster bootstrap over memes), one copy per meme gets the Wilson interval."""

    def __init__(self, kind_of: dict[str, str], n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95,
                 source_of: dict[str, str] | None = None):
        self.kind_of, self.n_resamples, self.seed, self.confidence = kind_of, n_resamples, seed, confidence
        self.source_of = source_of or {}
        self.rows: list[dict[str, Any]] = []
        self.items: list[dict[str, Any]] = []     # every pair behind the rows (injection_predictions.csv)

    def add(self, method: str, family: str, original: Sequence[Any], injected: Sequence[Any], ids: Sequence[str],
            mitigation: str = "none") -> None:
        """Paired predictions of originals and their injected copies `ids`; one row per kind of copy present."""
        self.items += [{"method": method, "family": family, "mitigation": mitigation, "id": str(i),
                        "source_id": str(self.source_of.get(i, i)), "copies": self.kind_of[i],
                        "original": o, "injected": x} for i, o, x in zip(ids, original, injected)]
        for kind in ("instruction", "control"):
            k = [j for j, i in enumerate(ids) if self.kind_of[i] == kind]
            if k:
                r = flip_rate([original[j] for j in k], [injected[j] for j in k], self.n_resamples, self.seed,
                              self.confidence, groups=[self.source_of.get(ids[j], ids[j]) for j in k])
                self.rows.append({"method": method, "family": family, "copies": kind, "mitigation": mitigation, **r})

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def item_frame(self) -> pd.DataFrame:
        """One row per injected copy and method: the answers on the original and on the copy."""
        return pd.DataFrame(self.items, columns=["method", "family", "mitigation", "id", "source_id", "copies",
                                                 "original", "injected"])


def common_predictions(methods: dict[str, dict[str, Any]], ids: Sequence[str]) -> pd.DataFrame:
    """Every method's answers on the common memes (predictions_common.csv): method, system, id, label,
    prediction (empty: no answer) and score where the method has one."""
    parts = []
    for name, m in methods.items():
        f = m["frame"].set_index("id").loc[list(ids)].reset_index()
        cols = [c for c in ("id", "label", "prediction", "score") if c in f]
        parts.append(f[cols].assign(method=name, system=m["system"]))
    return pd.concat(parts, ignore_index=True)[["method", "system", "id", "label", "prediction"]
                                               + (["score"] if any("score" in p for p in parts) else [])]


def attack_fewshot(fs, flips: FlipRows, methods: Sequence[str], fewshot_m: dict[str, dict[str, Any]],
                   copies: Sequence[Any], src_of: dict[str, str], mitigation: str, mitigated: Sequence[str]) -> None:
    """Notebook 04's moderator on the injected `copies` (sei.Meme) under each attacked setting
    ("main": 04's main row), and with `mitigation` for the settings in `mitigated`; flips
    against its answers on the originals (`fewshot_m`)."""
    for s in methods:
        name = fs.main_setting() if s == "main" else s
        if name not in fs.settings:
            continue
        f = fewshot_m[f"few-shot {name}"]["frame"]
        orig = dict(zip(f["id"], f["prediction"]))
        instructed = [x for x in copies if flips.kind_of[x.id] == "instruction"]
        for mitig, qs in [("none", copies)] + ([(mitigation, mitigate(instructed, mitigation))] if s in mitigated else []):
            preds = fs.predict(qs, name)
            flips.add(f"few-shot {name}", "fewshot", [orig[src_of[p.id]] for p in preds], [p.label for p in preds],
                      [p.id for p in preds], mitig)


def attack_court(chat, settings: dict[str, Any], flips: FlipRows, methods: Sequence[str],
                 debate_m: dict[str, dict[str, Any]], copies: Sequence[Any], src_of: dict[str, str],
                 id_map: dict[str, str], mitigation: str, mitigated: Sequence[str], out_dir: Path) -> None:
    """Notebook 05's court (its `settings`) on the injected H-VLI `copies` for each attacked
    variant (and with `mitigation` for those in `mitigated`); flips against its answers on the
    originals, and for ARCADE whether the rapid scan still routes the meme to Track I."""
    for v in [x for x in methods if x in settings["variants"]]:
        f = debate_m[f"debate {v}"]["frame"]
        orig = dict(zip(f["id"], f["prediction"]))
        instructed = [x for x in copies if flips.kind_of[x.id] == "instruction"]
        for mitig, recs in [("none", copies)] + ([(mitigation, mitigate(instructed, mitigation))] if v in mitigated else []):
            run = run_court(chat, recs, court_config(settings, v), out_dir,
                            f"injected_{v}" + ("" if mitig == "none" else f"_{mitig}"), model=settings["chat_preset"],
                            progress=False)
            g = debate_frame(run["results"])
            flips.add(f"debate {v}", "debate", [orig[src_of[i]] for i in g["id"]], g["prediction"].tolist(),
                      list(g["id"]), mitig)
            if v == "arcade" and mitig == "none":   # the rapid scan (a prosecutor role): explicit cues found before, not after
                before = {id_map.get(str(r["id"])): r["route"] for r in debate_m["debate arcade"]["results"]}
                flips.add("debate arcade: rapid scan finds explicit cues", "debate",
                          [int(before[src_of[r.id]] == "track1") for r in run["results"]],
                          [int(r.route == "track1") for r in run["results"]], [r.id for r in run["results"]])


def metric_key(name: str) -> str:
    """A method's name as a metrics.json key fragment."""
    return name.lower().replace("trace memeworld-clip_", "trace_").replace("few-shot ", "fewshot_").replace(
        "debate ", "debate_").replace("memeworld-clip/", "mwclip").replace(" ", "_").replace(":", "").replace(
        "(", "").replace(")", "")


def stage_metrics(table_common: pd.DataFrame, n_methods: int, n_common: int, majority: float, pairs: pd.DataFrame,
                  n_injected_llm: int, n_injected_trace: int, llm_calls: int, flips: pd.DataFrame) -> dict[str, Any]:
    """Notebook 06's metrics.json: sizes, the majority line, significant McNemar pairs, every
    method's accuracy on the common memes with its CI, and every injection flip rate."""
    m: dict[str, Any] = {"n_methods_compared": n_methods, "n_common_memes": n_common, "majority_acc_common": float(majority),
                         "n_significant_pairs": int(pairs.significant.sum()), "n_pairs": len(pairs),
                         "n_injected_llm": n_injected_llm, "n_injected_trace": n_injected_trace, "llm_calls": int(llm_calls)}
    acc = table_common[(table_common.metric == "accuracy") & (table_common.subset == "all")].set_index("method")
    for name, r in acc.iterrows():
        k = metric_key(name)
        m[f"acc_common_{k}"] = float(r.value)
        m[f"acc_common_{k}_ci_low"], m[f"acc_common_{k}_ci_high"] = float(r.ci_low), float(r.ci_high)
    for _, r in flips.iterrows():
        tail = metric_key(r.method) + ("" if r.mitigation == "none" else f"_{r.mitigation}") + \
            ("_control" if r.copies == "control" else "")
        m[f"injection_flip_rate_{tail}"] = float(r.flip_rate)
        if "reverse_flip_rate" in r:                     # non-hateful -> hateful: the other direction
            m[f"injection_reverse_flip_rate_{tail}"] = float(r.reverse_flip_rate)
    return m


#: the columns of notebook 06's confounders.csv (written, with its header, even when no row exists)
CONFOUNDER_COLUMNS = ["method", "subset", "metric", "value", "ci_low", "ci_high", "n", "ci", "system"]


def confounder_rows(methods: dict[str, dict[str, Any]], gold: pd.DataFrame, n_resamples: int, seed: int,
                    confidence: float, ci_method: str) -> pd.DataFrame:
    """Accuracy of each method on the memes of each benign-confounder kind (MemeWorld annotates
    them; the real FHM files do not, and then the frame is empty with its columns)."""
    rows: list[dict[str, Any]] = []
    kind = gold["confounder"] if "confounder" in gold else pd.Series(None, index=gold.index, dtype=object)
    annotated = kind.notna() & (kind != "none")
    for name, m in methods.items():
        ids = [i for i in m["frame"]["id"] if i in gold.index and annotated.loc[i]]
        if ids:
            subs = {k: list(v.index) for k, v in gold.loc[ids].groupby("confounder")}
            rows += metric_rows(m["frame"], name, subs, ("accuracy",), n_resamples, seed, confidence, ci_method,
                                system=m["system"])
    return pd.DataFrame(rows, columns=CONFOUNDER_COLUMNS)
