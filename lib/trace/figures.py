"""Notebook 01's and 02's figures: captions beside their memes, TRACE's caption selection, per-type
accuracy, training curves and seeds.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lib.compendium.artifacts import read_json
from lib.evaluation.figure_kit import (art_frame, art_path, claims_figure, figure, laid_out, legend_outside, show_image, subplots,
                                       tab10)


# ----------------------------------------------------------------------------- 01 captioning
@figure("captioning_examples", "notebooks/01_captioning.ipynb", ("captioning_examples",),
        "Caption sources and grounding boxes on six memes", images=True)
def draw_captioning_examples(profile: str):
    import matplotlib.patches as mpatches
    ex = read_json(art_path(profile, "captioning_examples"))
    fig, axes = subplots(2, 3, figsize=(12, 7.5))
    for ax in axes.ravel():
        ax.axis("off")
    for ax, e in zip(axes.ravel(), ex["items"]):
        show_image(ax, e["img"])
        for b in e["boxes"]:
            x0, y0, x1, y1 = b["box"]
            ax.add_patch(mpatches.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, lw=1.5, ec="tab:orange"))
            ax.text(x0 + 1, y1 - 2, b["tag"], fontsize=6, color="tab:orange")
        lines = [f"{c}: {t}" for c, t in e["captions"].items()]
        ax.set_title("\n".join(line if len(line) < 70 else line[:67] + "..." for line in lines), fontsize=7, loc="left")
    return laid_out(fig, f"Caption sources and boxes per meme (profile {profile})")


# ----------------------------------------------------------------------------- 02 TRACE
def _trace_runs(profile: str, dataset: str = "fhm") -> dict[str, dict[str, Any]]:
    out = {}
    d = art_path(profile, "trace_runs")
    names = read_json(art_path(profile, "trace_variants")) if art_path(profile, "trace_variants").exists() \
        else {p.name: p.name for p in sorted(d.glob(f"{dataset}_*"))}
    for label, folder in names.items():
        f = d / folder / "result.json"
        if f.exists():
            out[label] = read_json(f)
    return out


@figure("trace_selected_caption_share", "notebooks/02_finetuning.ipynb", ("trace_selected_share",),
        "Which candidate each TRACE variant selects: training picks, inference weights, argmax")
def draw_trace_selected_caption_share(profile: str):
    share = art_frame(profile, "trace_selected_share", read_csv={"index_col": [0, 1]})
    views = list(dict.fromkeys(share.index.get_level_values(0)))
    n = len(share.loc[views[0]])
    fig, axes = subplots(1, len(views), figsize=(14, 0.42 * n + 1.4), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, view in zip(axes, views):
        sub = share.loc[view]
        left = np.zeros(len(sub))
        for k, col in enumerate(sub.columns):
            ax.barh(sub.index, sub[col].fillna(0), left=left, color=tab10(k), label=col)
            left += sub[col].fillna(0).values
        ax.set(xlim=(0, 1), title=view)
    axes[0].invert_yaxis()
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, title="candidate")
    fig.suptitle("Which candidate each variant selects (test_seen)", y=1.02)
    return fig


@figure("trace_per_type_accuracy", "notebooks/02_finetuning.ipynb", ("trace_per_type",),
        "TRACE variants: accuracy per interaction type on test_seen", optional=True)
def draw_trace_per_type_accuracy(profile: str):
    pt = art_frame(profile, "trace_per_type", read_csv={"dtype": {"type": str}}).set_index("type")
    n_type = pt.pop("n")
    fig, ax = subplots(figsize=(11, 3.8))
    w = 0.85 / pt.shape[1]
    for k, name in enumerate(pt.columns):
        ax.bar(np.arange(len(pt)) + (k - (pt.shape[1] - 1) / 2) * w, pt[name], w, color=tab10(k), label=name)
    ax.set_xticks(np.arange(len(pt)), [f"{t}\nn={n_type[t]}" for t in pt.index])
    ax.set(xlabel="interaction type (text, image, final)", ylabel="accuracy (test_seen)", ylim=(0, 1.02))
    ax.set_title("TRACE: accuracy per interaction type", pad=8)
    return legend_outside(ax)


@figure("trace_training_curves", "notebooks/02_finetuning.ipynb", ("trace_variants",),
        "TRACE training curves: validation AUROC (restored epoch starred) and training loss")
def draw_trace_training_curves(profile: str):
    from matplotlib.ticker import MaxNLocator
    runs = _trace_runs(profile)
    fig, axes = subplots(1, 2, figsize=(12, 3.6))
    for k, (name, r) in enumerate(runs.items()):
        ep = [c["epoch"] for c in r["curve"]]
        axes[0].plot(ep, [c["val_auroc"] for c in r["curve"]], marker="o", ms=3, color=tab10(k), label=name)
        axes[1].plot(ep, [c["loss"] for c in r["curve"]], marker="o", ms=3, color=tab10(k), label=name)
        axes[0].plot([r["fit"]["best_epoch"]], [r["curve"][r["fit"]["best_epoch"] - 1]["val_auroc"]], "k*", ms=8)
    for ax, yl in zip(axes, ("validation AUROC (star: restored epoch)", "training loss")):
        ax.set(xlabel="epoch", ylabel=yl)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.suptitle("Training curves", y=1.02)
    return fig


@figure("trace_seeds", "notebooks/02_finetuning.ipynb", ("trace_seeds",),
        "TRACE's default and its loss ablations over seeds: each seed's test_seen accuracy, mean and sd")
def draw_trace_seeds(profile: str):
    t = art_frame(profile, "trace_seeds")
    variants = list(dict.fromkeys(t.variant))
    fig, axes = subplots(2, 1, figsize=(max(8.0, 1.0 * len(variants) + 2), 6.4), sharex=True)
    for ax, col, label in ((axes[0], "accuracy", "accuracy (test_seen)"), (axes[1], "acc_type_001", "accuracy on type 001")):
        for k, v in enumerate(variants):
            g = t[t.variant == v][col]
            mean, sd = float(g.mean()), float(g.std()) if len(g) > 1 else 0.0
            ax.scatter([k] * len(g), g, color=tab10(k), alpha=0.7, zorder=3)
            # an accuracy lies in [0, 1]: the sd bar is drawn inside that range (its length is in the label)
            ax.errorbar([k + 0.18], [mean], yerr=[[min(sd, mean)], [min(sd, 1 - mean)]], fmt="s", color="k", capsize=4)
            ax.annotate(f"{mean:.3f}\n± {sd:.3f}", (k + 0.26, mean), fontsize=7, va="center")
        ax.set_xlim(-0.5, len(variants) - 0.1)
        ax.set_ylabel(label)
    axes[1].set_xticks(range(len(variants)), variants, rotation=30, ha="right")
    n = int(t.groupby("variant").size().min())
    return laid_out(fig, f"TRACE over {n} seeds: dots are seeds, squares mean ± sd (bars kept inside [0, 1])")


@figure("trace_claims", "notebooks/02_finetuning.ipynb", ("trace_claims",),
        "TRACE's claims and their positive controls: each arm's accuracy with its interval, the test and its p")
def draw_trace_claims(profile: str):
    return claims_figure(art_path(profile, "trace_claims"), "accuracy on test_seen, 95% interval", "memes")
