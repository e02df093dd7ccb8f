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

from lib.artifacts import stage_dir
from lib.data_prep import load_prepared
from lib.debate import DIFFICULTY
from lib.metrics import metric_rows

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
    mw = stage_dir(profile, "00_data_prep", create=False) / "memeworld" / "memeworld.jsonl"
    if mw.exists():
        rows = [json.loads(x) for x in mw.read_text(encoding="utf-8").splitlines()]
        partners = {str(r["confounder_of"]) for r in rows if r.get("confounder_of") is not None}
        g = pd.DataFrame([{"id": str(r["id"]), "split": r["split"], "label": int(r["final_label"]), "type": r["type"],
                           "difficulty": DIFFICULTY[r["type"]],
                           "confounder": r.get("confounder_kind") or ("original" if str(r["id"]) in partners else "none")}
                          for r in rows if r["split"].startswith("test")])
        return g.set_index("id")
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
    stage = stage_dir(profile, "02_finetuning", create=False)
    runs = stage / "runs"
    named = set(json.loads((stage / "variants.json").read_text()).values()) if (stage / "variants.json").exists() else set()
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
    f = stage_dir(profile, "04_few_shot", create=False) / f"predictions_{dataset}.jsonl"
    if not f.exists():
        return {}
    by: dict[str, list[dict[str, Any]]] = {}
    for line in f.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
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
    d = stage_dir(profile, "05_debate", create=False)
    out = {}
    for f in sorted(d.glob("results_*.jsonl")) if d.exists() else []:
        v = f.stem[len("results_"):]
        if v == "rerun_check" or (variants is not None and v not in variants):
            continue
        res = [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines()]
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
