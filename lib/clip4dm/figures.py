"""Notebook 03's figures: CLIP4DM's epsilon sweep, backbones, nocaps domains, hard negatives, word
attributions and score distributions.
"""
from __future__ import annotations

import numpy as np

from lib.compendium.artifacts import read_json
from lib.evaluation.metrics import average_precision, precision_recall_points
from lib.evaluation.figure_kit import (art_frame, art_path, bar_groups, differences_figure, figure, laid_out, legend_outside, needs, show_image,
                                       subplots, tab10)


# ----------------------------------------------------------------------------- 03 CLIP4DM
@figure("clip4dm_epsilon_sweep", "notebooks/03_clip4dm.ipynb", ("clip4dm_epsilon_sweep",),
        "Choosing CLIP4DM's epsilon on the validation copy of HAT")
def draw_clip4dm_epsilon_sweep(profile: str):
    sweep = art_frame(profile, "clip4dm_epsilon_sweep")
    chosen = float(sweep.loc[sweep["chosen"].astype(bool), "epsilon"].iloc[0])
    encoder = read_json(art_path(profile, "clip4dm_settings")).get("encoder", "encoder") \
        if art_path(profile, "clip4dm_settings").exists() else "encoder"
    fig, ax = subplots(figsize=(7, 3.2))
    for col in ("word_f1", "word_precision", "word_recall", "hat_la", "share_of_words_kept", "share_abstaining"):
        if col in sweep:
            ax.plot(-sweep["epsilon"], sweep[col], marker="o", ms=3, label=col,
                    ls="--" if col == "share_abstaining" else "-")
    if "within_tie" in sweep:
        band = -sweep.loc[sweep["within_tie"].astype(bool), "epsilon"]
        ax.axvspan(band.min(), band.max(), color="grey", alpha=0.15, label="word F1 within the tie of the best")
    ax.axvline(-chosen, color="k", ls="--", lw=0.8, label=f"chosen {chosen:g}")
    ax.axvline(5e-5, color="grey", ls=":", lw=0.8, label="paper -5e-5")
    ax.set(xscale="log", xlabel="-epsilon (words scoring below epsilon are flagged)", ylabel="on hat_val (dev memes)",
           ylim=(0, 1.02), title=f"Choosing epsilon on validation ({encoder})")
    return legend_outside(ax)


@figure("clip4dm_backbones", "notebooks/03_clip4dm.ipynb", ("clip4dm_by_encoder",),
        "CLIP4DM per encoder: FOIL and nocaps-FOIL localisation and detection, the paper's values marked")
def draw_clip4dm_backbones(profile: str):
    t = art_frame(profile, "clip4dm_by_encoder")
    cols = [c for c in ("FOIL LA", "FOIL AP (F-CLIPScore)", "nocaps LA", "nocaps AP (F-CLIPScore)") if c in t.columns]
    ours, paper = t[t.source == "this run"], t[t.source == "paper"].set_index("encoder")
    fig, ax = subplots(figsize=(2.2 + 1.6 * len(cols), 3.2))
    where = bar_groups(ax, len(cols), [(r["encoder"], [r[c] for c in cols]) for _, r in ours.iterrows()])
    for k, (xs, (_, r)) in enumerate(zip(where, ours.iterrows())):
        if r["encoder"] in paper.index:
            ax.scatter(xs, [paper.loc[r["encoder"], c] for c in cols], marker="D", color="k", s=18, zorder=3,
                       label="paper" if k == 0 or "paper" not in ax.get_legend_handles_labels()[1] else None)
    ax.set_xticks(range(len(cols)), cols, fontsize=8)
    ax.set(ylim=(0, 1.02), ylabel="share / AP", title=f"CLIP4DM by encoder (profile {profile})")
    return legend_outside(ax)


@figure("clip4dm_nocaps_domains", "notebooks/03_clip4dm.ipynb", ("clip4dm_foil_table",),
        "FOIL and nocaps-FOIL by domain: localisation (chance marked) and detection AP by two scores")
def draw_clip4dm_nocaps_domains(profile: str):
    t = art_frame(profile, "clip4dm_foil_table")
    t = t[(t.benchmark == "foil") | t.benchmark.str.startswith("nocaps_foil/")]
    labels = ["FOIL" if b == "foil" else b.replace("nocaps_foil/", "nocaps-FOIL\n") for b in t.benchmark]
    cols = {"la": "LA", "ap_clipscore": "AP (CLIPScore)", "ap_fclipscore": "AP (F-CLIPScore)"}
    fig, ax = subplots(figsize=(7.5, 3.3))
    xs = bar_groups(ax, len(t), [(name, t[c]) for c, name in cols.items()])[0]      # LA's bars come first
    ax.scatter(xs, t["la_chance"], marker="_", s=120, color="k", zorder=3, label="LA chance (any word)")
    if "la_chance_content" in t:
        ax.scatter(xs, t["la_chance_content"], marker="_", s=120, color="tab:red", zorder=3,
                   label="LA chance (content words)")
    ax.axhline(0.5, color="grey", ls=":", lw=0.8, label="AP chance")
    ax.set_xticks(range(len(t)), labels, fontsize=8)
    ax.set(ylim=(0, 1.02), ylabel="share / AP",
           title="nocaps-FOIL: in-domain (known objects), near (some novel), out (all novel)")
    return legend_outside(ax)


@figure("clip4dm_hard_negatives", "notebooks/03_clip4dm.ipynb", ("clip4dm_hard_negatives",),
        "The F-CLIPScore ablation for the main model and two leak-free models, with and without hard negatives",
        optional=True)
def draw_clip4dm_hard_negatives(profile: str):
    t = art_frame(profile, "clip4dm_hard_negatives")
    t = t[t.metric != "LA"]
    benches = list(dict.fromkeys(t.benchmark))
    models, scores = list(dict.fromkeys(t.model)), list(dict.fromkeys(t.metric))
    fig, axes = subplots(1, len(benches), figsize=(5.2 * len(benches), 3.4), sharey=True, squeeze=False)
    for ax, b in zip(axes[0], benches):
        sub = t[t.benchmark == b].set_index(["model", "metric"])["value"]
        bar_groups(ax, len(models), [(sc if ax is axes[0][0] else None, [sub.get((m, sc), np.nan) for m in models])
                                     for sc in scores])
        ax.axhline(0.5, color="grey", ls=":", lw=0.8)
        ax.set_xticks(range(len(models)), [m.replace(", ", ",\n").replace(" (", "\n(") for m in models], fontsize=7)
        ax.set(title={"foil": "FOIL", "nocaps_foil": "nocaps-FOIL"}.get(b, b), ylim=(0, 1.02))
    axes[0][0].set_ylabel("AP, originals vs foils")
    fig.legend(loc="upper left", bbox_to_anchor=(1.0, 0.9), fontsize=8)
    return laid_out(fig, "Which score separates originals from foils, by how the model was trained")


@figure("clip4dm_word_attributions", "notebooks/03_clip4dm.ipynb", ("clip4dm_examples",),
        "CLIP4DM word attributions of original and foil captions, the swapped word outlined", images=True)
def draw_clip4dm_word_attributions(profile: str):
    ex = read_json(art_path(profile, "clip4dm_examples"))
    items = ex["items"]
    fig, axes = subplots(len(items), 3, figsize=(12, 2.3 * len(items)),
                             gridspec_kw={"width_ratios": [0.6, 2, 2]}, squeeze=False)
    for row, pair in zip(axes, items):
        show_image(row[0], pair["img"])
        lims = []
        for ax, kind in zip(row[1:], ("orig", "foil")):
            r = pair[kind]
            words = [w for w, _ in r["all_word_attributions"]]
            vals = np.array([s for _, s in r["all_word_attributions"]])
            bars = ax.bar(range(len(words)), vals, color=["#c44e52" if v < 0 else "#4c72b0" for v in vals])
            for k, p in enumerate(r["word_positions"]):
                if p in r["misaligned_positions"]:       # the foil at its position only, not every equal string
                    bars[k].set_edgecolor("black")
                    bars[k].set_linewidth(2.2)
            ax.set_xticks(range(len(words)), words, rotation=60, fontsize=7)
            ax.axhline(0, color="k", lw=0.6)
            ax.set_title(f"{kind}: CLIPScore {r['clip_score']:.2f}, F-CLIPScore {r['f_clipscore']:.2e}", fontsize=8)
            lims.append(ax.get_ylim())
        lo, hi = min(v[0] for v in lims), max(v[1] for v in lims)
        for ax in row[1:]:
            ax.set_ylim(lo, hi)                          # one y-scale per row: original and foil compare directly
    fig.suptitle(f"CLIP4DM word attributions ({ex.get('encoder', '')}, profile {profile}); black outline: the swapped word",
                 fontsize=10)
    return laid_out(fig)


@figure("clip4dm_score_distributions", "notebooks/03_clip4dm.ipynb", (needs("clip4dm_results", benchmark="foil"),),
        "FOIL: precision-recall of three caption scores, and F-CLIPScore by caption kind")
def draw_clip4dm_score_distributions(profile: str):
    res = art_frame(profile, "clip4dm_results", benchmark="foil")
    orig = ~res["is_foil"].astype(bool).to_numpy()
    scores = {"CLIPScore": res["clip_score"].to_numpy(), "sum of negative attributions": res["sum_negative_attribution"].to_numpy(),
              "F-CLIPScore": res["f_clipscore"].to_numpy()}
    fig, axes = subplots(1, 2, figsize=(11, 3.4))
    for k, (name, sc) in enumerate(scores.items()):
        pr, rc = precision_recall_points(sc, orig)
        axes[0].plot(rc, pr, color=tab10(k), label=f"{name} (AP {average_precision(sc, orig):.3f})")
    axes[0].axhline(orig.mean(), color="grey", ls=":", lw=0.8, label="chance")
    axes[0].set(xlabel="recall (original captions)", ylabel="precision", title="FOIL: originals vs foils", ylim=(0, 1.02))
    axes[0].legend(fontsize=7, loc="lower left")
    f = scores["F-CLIPScore"]
    bins = np.concatenate([-np.logspace(np.log10(max(1e-8, -f.min())), -8, 30), [0]])
    bins[0] = min(bins[0], f.min())   # the lowest score itself: 10 ** log10(x) may round past it, by CPU
    for lab, mask in (("original", orig), ("foil", ~orig)):
        axes[1].hist(f[mask], bins=np.unique(bins), histtype="step", density=False, label=lab)
    axes[1].set_xscale("symlog", linthresh=1e-6)
    axes[1].set(xlabel="F-CLIPScore (symlog)", ylabel="captions", title="F-CLIPScore by caption kind")
    axes[1].legend(fontsize=8)
    return laid_out(fig)


@figure("clip4dm_claims", "notebooks/03_clip4dm.ipynb", ("clip4dm_claims",),
        "CLIP4DM's claims beside their oracle-attribution controls: AP differences, intervals over images, design MDD")
def draw_clip4dm_claims(profile: str):
    return differences_figure(art_path(profile, "clip4dm_claims"), "AP difference A - B (95% interval over images)")
