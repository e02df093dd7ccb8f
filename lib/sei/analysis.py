"""See, Explain, Intervene analysed: results and per-answer frames, lexical statistics with bootstrap
intervals, sentiment, the controls plot, how often answers follow the exemplars' labels, and Table 2.
Nothing here loads a model: figures import it freely.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from lib.evaluation.metrics import mean_ci
from lib.compendium.params import is_paper
from lib.sei.fewshot import Prediction, subgroup
from lib.evaluation.textmetrics import token_count, type_token_ratio, unigram_perplexity, vader_label


# ----------------------------------------------------------------------------- tables and figures
def results_frame(results: dict[str, dict[str, Any]]):
    """One row per setting: classification, statuses, support, E/I scores, cost."""
    import pandas as pd
    rows = []
    for name, r in results.items():
        rows.append({"setting": name, **{k: v for k, v in r.items() if not isinstance(v, (list, dict))}})
    return pd.DataFrame(rows).set_index("setting")


#: the columns of analysis_frame and ci_frame, kept when they have no row
ANALYSIS_COLUMNS = ("id", "setting", "subgroup", "kind", "text", "tokens", "ttr", "ppl", "sentiment")
CI_COLUMNS = ("kind", "subgroup", "measure", "n", "mean", "low", "high", "ci")


def analysis_frame(preds: Sequence[Prediction]):
    """One row per generated text with its subgroup and lexical measures (§7)."""
    import pandas as pd
    rows = []
    for p in preds:
        g = subgroup(p.gold, p.label)
        if g is None:
            continue
        for kind, t in (("explanation", p.explanation), ("intervention", p.intervention)):
            if not t:
                continue
            rows.append({"id": p.id, "setting": p.setting, "subgroup": g, "kind": kind, "text": t,
                         "tokens": token_count(t), "ttr": type_token_ratio(t), "ppl": unigram_perplexity(t),
                         "sentiment": vader_label(t)})
    # its columns even when no answer has a text (a model whose every call failed): the tables and figures
    # built on it are then empty, not a KeyError
    return pd.DataFrame(rows, columns=list(ANALYSIS_COLUMNS))


def ci_frame(df, measures=("tokens", "ttr", "ppl"), n_resamples: int = 1000, method: str = "BCa", seed: int = 0):
    """Mean and bootstrap CI per (kind, subgroup, measure), with n and the CI method used."""
    import pandas as pd
    rows = []
    for (kind, g), sub in df.groupby(["kind", "subgroup"]):
        for m in measures:
            mean, lo, hi, used = mean_ci(sub[m].tolist(), n_resamples, method, seed)
            rows.append({"kind": kind, "subgroup": g, "measure": m, "n": len(sub), "mean": mean, "low": lo,
                         "high": hi, "ci": used})
    return pd.DataFrame(rows, columns=list(CI_COLUMNS))


def plot_lexical(ci, title: str = ""):
    """Figure 3 analogue: mean with 95% CI per subgroup, explanations and interventions."""
    import matplotlib.pyplot as plt
    measures = ["tokens", "ttr", "ppl"]
    names = {"tokens": "token count", "ttr": "type-token ratio", "ppl": "unigram perplexity"}
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    order = ["cp", "cn", "wp", "wn"]
    for ax, m in zip(axes, measures):
        for k, (kind, mk) in enumerate((("explanation", "o"), ("intervention", "s"))):
            sub = ci[(ci.measure == m) & (ci.kind == kind)].set_index("subgroup").reindex(order)
            x = np.arange(len(order)) + (k - 0.5) * 0.2
            y = sub["mean"].to_numpy(dtype=float)
            err = np.vstack([y - sub["low"].to_numpy(dtype=float), sub["high"].to_numpy(dtype=float) - y])
            ax.errorbar(x, y, yerr=np.nan_to_num(err), fmt=mk, capsize=3, label=kind)
        ax.set_xticks(range(len(order)), order)
        ax.set_title(names[m], fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_sentiment(df, title: str = ""):
    """Figure 5 analogue: share of VADER classes per subgroup and text kind."""
    import matplotlib.pyplot as plt
    groups = [("cp", "explanation"), ("cn", "explanation"), ("wp", "explanation"), ("wn", "explanation"),
              ("cp", "intervention"), ("wp", "intervention")]
    fig, ax = plt.subplots(figsize=(7, 3))
    colours = {"positive": "#4dac26", "neutral": "#bababa", "negative": "#d01c8b"}
    bottom = np.zeros(len(groups))
    for cls in ("negative", "neutral", "positive"):
        vals = []
        for g, kind in groups:
            sub = df[(df.subgroup == g) & (df.kind == kind)]
            vals.append(100 * float((sub.sentiment == cls).mean()) if len(sub) else 0.0)
        ax.bar(range(len(groups)), vals, bottom=bottom, color=colours[cls], label=cls)
        bottom += np.array(vals)
    ns = [len(df[(df.subgroup == g) & (df.kind == k)]) for g, k in groups]
    ax.set_xticks(range(len(groups)), [f"{g}-{k[:2]}\n(n={n})" for (g, k), n in zip(groups, ns)], fontsize=8)
    ax.set_ylabel("% of texts")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(title, fontsize=10)
    return fig


def plot_controls(results: dict[str, dict[str, Any]], chance: float, knn: float | None = None, title: str = ""):
    """Accuracy per setting with the majority-class line and the exemplars' own vote."""
    import matplotlib.pyplot as plt
    names = list(results)
    acc = [results[n]["acc"] for n in names]
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(names) + 2), 3.2))
    ax.bar(range(len(names)), acc, color=["#4c72b0" if "/" in n else "#dd8452" for n in names])
    ax.axhline(chance, ls="--", color="k", lw=1, label=f"majority class ({chance:.2f})")
    if knn is not None:
        ax.axhline(knn, ls=":", color="#55a868", lw=1.5, label=f"exemplars' majority label, no model ({knn:.2f})")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=10)
    return fig


def exemplar_label_following(preds: Sequence[Prediction]) -> dict[str, float]:
    """How often the predicted label equals the majority label shown in the prompt's exemplars
    (and the last exemplar's label), over answers with a label and at least one exemplar
    (`n_following`: how many; the setting's `n` stays the number of memes it answered)."""
    both = [p for p in preds if p.label in (0, 1) and p.shown_labels]
    if not both:
        return {"follows_majority": float("nan"), "follows_last": float("nan"), "n_following": 0}
    maj = [Counter(p.shown_labels).most_common(1)[0][0] for p in both]
    return {"follows_majority": float(np.mean([p.label == m for p, m in zip(both, maj)])),
            "follows_last": float(np.mean([p.label == p.shown_labels[-1] for p in both])), "n_following": len(both)}


def table2_frame(all_preds_keys: Sequence[tuple[str, str, str]], results: dict[str, dict[str, Any]], key_fn,
                 profile: str):
    """The paper's Table 2 / 4 layout: one row per (model, retriever, n) of the retrieved grid, one
    column group per dataset (acc, macro-F1, explanation and intervention scores, support), and in
    the paper profile the paper's SigLIP numbers beside each row it has."""
    import pandas as pd
    cols = ("acc", "macro_f1", "expl_rouge_l", "expl_semsim", "expl_bertscore_f1", "int_rouge_l", "int_semsim",
            "int_bertscore_f1", "support")
    rows: dict[tuple[str, str, int], dict[tuple[str, str], Any]] = {}
    for model, ds, name in all_preds_keys:
        r, _, n = name.partition("/")
        if not n.isdigit():
            continue
        res = results[key_fn(model, ds, name)]
        row = rows.setdefault((model, r, int(n)), {})
        for c in cols:
            row[(ds, c)] = res.get(c)
        p = paper_row(model, ds, int(n), r) if is_paper(profile) else None
        for c in cols if p else ():
            row[(ds, f"paper {c}")] = p[c]
    df = pd.DataFrame.from_dict(rows, orient="index")
    if len(df):
        df.index.names = ["model", "retriever", "n"]
        df.columns = pd.MultiIndex.from_tuples(df.columns)
    return df


PAPER_COLUMNS = ("acc", "macro_f1", "expl_rouge_l", "expl_semsim", "expl_bertscore_f1", "int_rouge_l", "int_semsim",
                 "int_bertscore_f1", "support")


def paper_row(model_preset: str, dataset: str, n: int, retriever: str = "siglip") -> dict[str, float] | None:
    """The paper's Table 2 numbers for a model preset, dataset and n; Table 2 retrieves with SigLIP,
    so another retriever (CLIP, BLIP: Table 4) gets none."""
    key = next((k for k in ("gpt-4o", "internvl3.5-8b", "pixtral-12b") if k in model_preset), None)
    table = {"fhm": PAPER_TABLE2_FHM, "mami": PAPER_TABLE2_MAMI}.get(dataset)
    if key is None or table is None or "siglip" not in retriever or (key, n) not in table:
        return None
    v = table[(key, n)]
    return {c: (x / 100 if c in ("acc", "macro_f1") else x) for c, x in zip(PAPER_COLUMNS, v)}


#: The paper's Table 3 (agents on held-out splits) and Table 2 rows (SigLIP retrieval), for the
#: paper-profile rows. acc/mF1 in %, texts in [0, 1]; keys (model, n).
PAPER_TABLE3 = {"captioner": ("MemeCap", 559, 0.3571, 0.6673, 0.9042), "explainer": ("HatReD", 246, 0.3777, 0.6326, 0.9079),
                "commonsense": ("MemeSense", 134, 0.2501, 0.7212, 0.8999),
                "intervention": ("MemeSense", 134, 0.3438, 0.7857, 0.9114)}


PAPER_TABLE2_FHM = {("gpt-4o", 2): (79.35, 79.34, .221, .648, .886, .144, .465, .871, 400),
                    ("gpt-4o", 4): (79.45, 79.44, .233, .674, .89, .155, .491, .875, 401),
                    ("gpt-4o", 8): (80.26, 80.25, .242, .679, .891, .195, .563, .883, 409),
                    ("internvl3.5-8b", 2): (71.41, 71.41, .209, .599, .88, .215, .58, .888, 341),
                    ("internvl3.5-8b", 4): (73.55, 73.43, .215, .625, .883, .263, .701, .901, 324),
                    ("internvl3.5-8b", 8): (71.41, 70.33, .227, .635, .887, .29, .777, .907, 252),
                    ("pixtral-12b", 2): (69.79, 69.78, .197, .56, .88, .213, .611, .887, 338),
                    ("pixtral-12b", 4): (70.3, 70.26, .211, .606, .884, .249, .699, .897, 329),
                    ("pixtral-12b", 8): (72.53, 72.45, .224, .635, .887, .272, .774, .903, 330)}


PAPER_TABLE2_MAMI = {("gpt-4o", 2): (88.25, 88.23, .224, .615, .886, .139, .508, .869, 438),
                     ("gpt-4o", 4): (88.78, 88.75, .231, .641, .888, .172, .565, .877, 444),
                     ("gpt-4o", 8): (89.1, 89.07, .238, .654, .891, .239, .693, .894, 446),
                     ("internvl3.5-8b", 2): (71.96, 71.69, .207, .581, .885, .332, .792, .915, 386),
                     ("internvl3.5-8b", 4): (74.39, 74.24, .186, .569, .882, .373, .83, .918, 388),
                     ("internvl3.5-8b", 8): (75.34, 75.25, .163, .557, .879, .395, .843, .919, 385),
                     ("pixtral-12b", 2): (67.94, 65.88, .191, .513, .882, .326, .802, .912, 437),
                     ("pixtral-12b", 4): (73.65, 72.89, .19, .536, .881, .358, .833, .918, 427),
                     ("pixtral-12b", 8): (75.42, 74.99, .17, .55, .879, .391, .849, .921, 418)}
