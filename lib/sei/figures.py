"""Notebook 04's figures: the agents against their baseline, few-shot accuracy, lexical, coherence,
sentiment and word-shift views of the explanations, the claims and their cold runs.
"""
from __future__ import annotations

import json

import numpy as np

from lib.evaluation import textmetrics as tm
from lib.compendium.artifacts import read_json, read_jsonl
from lib.evaluation.metrics import mean_ci
from lib.evaluation.preconditions import LABEL_AGREEMENT_MIN
from lib.sei import analysis
from lib.sei.analysis import plot_controls
from lib.sei.fewshot import Prediction, main_setting_name
from lib.evaluation.figure_kit import art_frame, art_path, claims_figure, cold_runs_figure, figure, needs, subplots


# ----------------------------------------------------------------------------- 04 few-shot
def _fewshot_preds(profile: str, dataset: str = "fhm"):
    """Notebook 04's predictions of its first model (the rows its figures pool)."""
    rows = read_jsonl(art_path(profile, "sei_predictions", dataset=dataset))
    first = rows[0].get("model") if rows else None
    fields = Prediction.__dataclass_fields__
    return [Prediction(**{k: v for k, v in r.items() if k in fields}) for r in rows if r.get("model") == first]


def _fewshot_main_answers(profile: str, dataset: str = "fhm"):
    """The answers of notebook 04's main setting (one per test meme): what its §7 figures analyse."""
    st = read_json(art_path(profile, "sei_settings"))
    main = main_setting_name(st["retrievers"], st["shots"])
    return [p for p in _fewshot_preds(profile, dataset) if p.setting == main], main


@figure("few_shot_agents", "notebooks/04_few_shot.ipynb", ("sei_table3",),
        "Table 3: each fine-tuned agent beside the nearest-training-meme baseline")
def draw_few_shot_agents(profile: str):
    rows3 = read_json(art_path(profile, "sei_table3"))["rows"]
    fig, axes = subplots(1, 2, figsize=(9, 3))
    for ax, m in zip(axes, ["rouge_l", "semsim"]):
        x = np.arange(len(rows3))
        ax.bar(x - 0.2, [r[m] for r in rows3], 0.4, label="agent")
        ax.bar(x + 0.2, [r[f"baseline_{m}"] for r in rows3], 0.4, label="nearest training meme")
        ax.set_xticks(x, [r["agent"] for r in rows3])
        ax.set_title({"rouge_l": "ROUGE-L", "semsim": "semantic similarity"}[m], fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Table 3: agents on held-out memes ({profile})", fontsize=10)
    return fig


@figure("few_shot_accuracy", "notebooks/04_few_shot.ipynb", ("sei_results", needs("sei_predictions", dataset="fhm")),
        "Few-shot accuracy per setting and control, with the majority class and the exemplars' own vote")
def draw_few_shot_accuracy(profile: str):
    res = read_json(art_path(profile, "sei_results"))
    preds = _fewshot_preds(profile)
    gold = {p.id: p.gold for p in preds}
    share = float(np.mean(list(gold.values())))
    first = next(iter(res))
    prefix = first.split(" · ")[0] + " · " if " · " in first else ""       # several models: the first one's rows
    settings = {k[len(prefix):]: v for k, v in res.items() if k.startswith(prefix) and "knn_vote" not in k}
    knn = next((v["acc"] for k, v in res.items() if k.endswith("knn_vote")), None)
    model = json.loads(art_path(profile, "sei_predictions", dataset="fhm").read_text().splitlines()[0]).get("model", "")
    return plot_controls(settings, max(share, 1 - share), knn,
                         f"Few-shot accuracy, {model} ({profile}, {len(gold)} test memes)")


@figure("few_shot_lexical", "notebooks/04_few_shot.ipynb", (needs("sei_predictions", dataset="fhm"), "sei_settings"),
        "Figure 3 analogue: length, type-token ratio and perplexity of generated texts, by outcome")
def draw_few_shot_lexical(profile: str):
    p4 = read_json(art_path(profile, "sei_settings"))
    answers, main = _fewshot_main_answers(profile)
    ci = analysis.ci_frame(analysis.analysis_frame(answers), n_resamples=p4.get("ci_resamples", 1000),
                      method=p4.get("ci_method", "BCa"), seed=p4.get("seed", 0))
    return analysis.plot_lexical(ci, f"Figure 3 analogue: {main}, one answer per meme")


@figure("few_shot_coherence", "notebooks/04_few_shot.ipynb", ("sei_coherence",),
        "Figure 4 analogue: explanation-intervention coherence for correct and wrong hateful calls")
def draw_few_shot_coherence(profile: str):
    coh = art_frame(profile, "sei_coherence")
    fig, ax = subplots(figsize=(4, 3))
    for k, g in enumerate(["cp", "wp"]):
        v = coh[coh.subgroup == g]["coherence"].tolist()
        m, lo, hi, _ = mean_ci(v, 1000, "BCa", 0)
        ax.errorbar([k], [m], yerr=[[m - lo if lo == lo else 0], [hi - m if hi == hi else 0]], fmt="o", capsize=4)
        ax.annotate(f"n={len(v)}", (k, m), textcoords="offset points", xytext=(8, 0), fontsize=8)
    ax.set_xticks([0, 1], ["cp", "wp"])
    ax.set_xlim(-0.5, 1.5)
    ax.set_ylabel("semantic similarity")
    ax.set_title("Figure 4 analogue: explanation-intervention coherence", fontsize=9)
    return fig


@figure("few_shot_sentiment", "notebooks/04_few_shot.ipynb", (needs("sei_predictions", dataset="fhm"), "sei_settings"),
        "Figure 5 analogue: VADER sentiment classes of generated texts")
def draw_few_shot_sentiment(profile: str):
    answers, main = _fewshot_main_answers(profile)
    return analysis.plot_sentiment(analysis.analysis_frame(answers), f"Figure 5 analogue: VADER sentiment ({main})")


@figure("few_shot_wordshift", "notebooks/04_few_shot.ipynb", (needs("sei_predictions", dataset="fhm"), "sei_settings"),
        "Figure 6 analogue: Shannon-entropy word shift of explanations, predicted hateful vs not")
def draw_few_shot_wordshift(profile: str):

    ana = analysis.analysis_frame(_fewshot_main_answers(profile)[0])
    expl = ana[ana.kind == "explanation"]
    f_h = tm.word_freqs(expl[expl.subgroup.isin(["cp", "wp"])]["text"])
    f_n = tm.word_freqs(expl[expl.subgroup.isin(["cn", "wn"])]["text"])
    fig, ax = subplots(figsize=(5.5, 6))
    if f_h and f_n:
        tm.plot_word_shift(tm.entropy_shift(f_n, f_h), 30, "Figure 6 analogue: Shannon-entropy word shift of explanations",
                           ("predicted non-hateful", "predicted hateful"), ax)
    else:
        ax.text(0.5, 0.5, "no word shift: one side has no explanation", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
    return fig


@figure("few_shot_claims", "notebooks/04_few_shot.ipynb", ("sei_claims",),
        "Each See-Explain-Intervene claim as a paired comparison: both settings' accuracy with 95% intervals "
        "on the same memes (Wilson; a row pooled over cold runs: bootstrap over memes)")
def draw_few_shot_claims(profile: str):
    return claims_figure(art_path(profile, "sei_claims"),
                          "accuracy (an unreadable answer is wrong), 95% interval", "memes")


@figure("few_shot_cold_runs", "notebooks/04_few_shot.ipynb", ("sei_cold_runs", "sei_claims"),
        "The few-shot claims over cold runs: each run's accuracy difference and the pooled one, clustered by meme",
        optional=True)
def draw_few_shot_cold_runs(profile: str):
    return cold_runs_figure(art_path(profile, "sei_cold_runs"), art_path(profile, "sei_claims"),
                             "memes")


@figure("few_shot_retrieval", "notebooks/04_few_shot.ipynb", ("sei_retrieval",),
        "How informative the retrieved exemplars are: label and type agreement with the query at each k, per retriever")
def draw_few_shot_retrieval(profile: str):
    t = art_frame(profile, "sei_retrieval")
    cols = [c for c in ("label", "type") if f"{c}_agreement" in t.columns and t[f"{c}_agreement"].notna().any()]
    fig, axes = subplots(1, len(cols), figsize=(5.2 * len(cols), 3.6), squeeze=False)
    for ax, c in zip(axes[0], cols):
        for k, ((ds, r), g) in enumerate(t.groupby(["dataset", "retriever"], sort=False)):
            g = g.sort_values("n")
            ax.plot(g["n"], g[f"{c}_agreement"], marker="o", color=f"C{k}", label=f"{r} ({ds})")
            ax.axhline(g[f"{c}_base_rate"].iloc[0], color=f"C{k}", ls=":", lw=1)
        if c == "label":
            ax.axhline(LABEL_AGREEMENT_MIN, color="grey", ls="--", lw=1, label=f"precondition ({LABEL_AGREEMENT_MIN:.2f})")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(t["n"].unique()), [str(n) for n in sorted(t["n"].unique())])
        ax.set_xlabel("k exemplars")
        ax.set_ylabel(f"exemplars with the query's {c}")
        ax.set_title(f"{c} agreement (dotted: base rate)", fontsize=9)
        ax.set_ylim(0, 1)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
