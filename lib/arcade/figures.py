"""Notebook 05's figures: ARCADE and its variants against the direct judge, the claims, their cold runs
and the debate's cost.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from lib.compendium.artifacts import read_json
from lib.arcade.report import plot_accuracy, plot_cost, results_from_jsonl
from lib.evaluation.figure_kit import art_glob, art_path, claims_figure, cold_runs_figure, figure, needs


# ----------------------------------------------------------------------------- 05 debate
def _debate_runs(profile: str) -> dict[str, dict[str, Any]]:
    runs = {name: {**read_json(f), "results": results_from_jsonl(art_path(profile, "debate_results", variant=name))}
            for name, f in art_glob(profile, "debate_eval").items() if name != "rerun_check"}
    order = list(read_json(art_path(profile, "debate_settings"))["variants"]) \
        if art_path(profile, "debate_settings").exists() else []                   # notebook 05's order
    return dict(sorted(runs.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


@figure("debate_accuracy", "notebooks/05_debate.ipynb", (needs("debate_eval", variant="arcade"),),
        "ARCADE and its variants against the direct baseline, per difficulty and interaction type")
def draw_debate_accuracy(profile: str):
    runs = _debate_runs(profile)
    gts = [r.gt for r in next(iter(runs.values()))["results"]]
    label, count = Counter(gts).most_common(1)[0]
    fig = plot_accuracy(runs, "corrected", chance=count / len(gts))
    fig.suptitle(f"ARCADE vs the direct baseline ({profile}); dashed: always answering {label} ({count / len(gts):.2f})",
                 fontsize=10, y=1.03)
    return fig


@figure("debate_claims", "notebooks/05_debate.ipynb", ("debate_claims",),
        "Each ARCADE claim as a comparison of two variants with 95% intervals: accuracy on the same posts (Wilson; a "
        "row pooled over cold runs: bootstrap over posts); below, on an axis of its own, the gate's rows: the share "
        "of posts sent to Track II")
def draw_debate_claims(profile: str):
    return claims_figure(art_path(profile, "debate_claims"), "accuracy (corrected view), 95% interval", "posts",
                         share_xlabel="share of posts sent to Track II, 95% interval")


@figure("debate_cold_runs", "notebooks/05_debate.ipynb", ("debate_cold_runs", "debate_claims"),
        "ARCADE's headline claim over cold runs: each run's accuracy difference and the pooled one, clustered by post",
        optional=True)
def draw_debate_cold_runs(profile: str):
    return cold_runs_figure(art_path(profile, "debate_cold_runs"), art_path(profile, "debate_claims"), "posts")


@figure("debate_cost", "notebooks/05_debate.ipynb", (needs("debate_eval", variant="arcade"),),
        "The debate's calls and tokens per sample, by route")
def draw_debate_cost(profile: str):
    return plot_cost(_debate_runs(profile))
