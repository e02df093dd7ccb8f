"""Every figure of the compendium, drawn from artifacts alone.

Each figure is a function `draw_<name>(profile) -> matplotlib Figure` that reads only files under
`artifacts/<profile>/` (never a model, never a dataset loader); the notebook that produces the
artifacts calls `figures.show(name, profile)` once they are written, and notebook 07 redraws all
of them the same way, then writes the index `figures/README.md`.

    from lib import figures
    figures.show("trace_training_curves", "embedded")     # draw, save PNG + PDF, show inline
    figures.redraw_all("embedded")                        # notebook 07
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from lib import ROOT, plotting, textmetrics as tm
from lib.artifacts import ARTIFACTS_ROOT, read_json, write_text
from lib.crosseval import plot_flips, plot_forest, plot_mcnemar, plot_type_heatmap
from lib.debate_report import plot_accuracy, plot_cost, results_from_jsonl
from lib.embedded_models import curve_figure
from lib.metrics import average_precision, mean_ci, precision_recall_points
from lib.params import load_profile
from lib.sei import Prediction
from lib.serving import throughput_figure


@dataclass(frozen=True)
class Figure:
    name: str
    notebook: str               # the notebook (or python stage) whose artifacts it draws
    artifacts: tuple[str, ...]  # paths under artifacts/<profile>/
    caption: str
    draw: Callable[[str], Any]
    optional: bool = False      # drawn only where its artifacts exist (e.g. MemeWorld-only views)


REGISTRY: dict[str, Figure] = {}


def _art(profile: str, *parts: str) -> Path:
    return ARTIFACTS_ROOT / profile / Path(*parts)


def figure(name: str, notebook: str, artifacts: tuple[str, ...], caption: str, optional: bool = False):
    def deco(fn):
        REGISTRY[name] = Figure(name, notebook, artifacts, caption, fn, optional)
        return fn
    return deco


def available(profile: str) -> list[Figure]:
    """Figures whose artifacts exist for this profile."""
    return [f for f in REGISTRY.values() if all(_art(profile, a).exists() for a in f.artifacts)]


def show(name: str, profile: str):
    """Draw one registered figure from its artifacts, save it (PNG + PDF) and show it inline."""
    if name not in REGISTRY:
        raise KeyError(f"no figure {name!r}; registered: {', '.join(REGISTRY)}")
    missing = [a for a in REGISTRY[name].artifacts if not _art(profile, a).exists()]
    if missing:
        raise FileNotFoundError(f"figure {name}: artifacts/{profile}/{missing[0]} is missing "
                                f"(produced by {REGISTRY[name].notebook})")
    fig = REGISTRY[name].draw(profile)
    plotting.show(fig, name, profile)


def _tab10(k: int):
    import matplotlib.pyplot as plt
    return plt.get_cmap("tab10").colors[k % 10]


# ----------------------------------------------------------------------------- 00 data
@figure("memeworld_unimodal_readers", "notebooks/00_data_prep.ipynb", ("00_data_prep/memeworld/datasheet.json",),
        "MemeWorld: accuracy of the Bayes reader of one modality per interaction type", optional=True)
def draw_memeworld_unimodal_readers(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    sheet = read_json(_art(profile, "00_data_prep/memeworld/datasheet.json"))
    per_type = pd.DataFrame(sheet["bayes_readers"]).round(3).drop(index="overall")
    fig, ax = plt.subplots(figsize=(9, 3.4))
    colors = {"text_only": "tab:blue", "image_only": "tab:orange", "rule_reader": "tab:green"}
    w = 0.27
    for k, col in enumerate(per_type.columns):
        ax.bar([x + (k - 1) * w for x in range(len(per_type))], per_type[col], w, color=colors.get(col), label=col)
    ax.set_xticks(range(len(per_type)), per_type.index)
    ax.set(xlabel="interaction type (text, image, final)", ylabel="accuracy on test", ylim=(0, 1.02))
    ax.set_title("MemeWorld: the Bayes reader of one modality, per type (not a per-type bound)", pad=8)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig


def _image_grid(items: list[dict[str, str]], cols: int = 4, title: str = ""):
    """A grid of images (items: {img, title})."""
    import matplotlib.pyplot as plt
    rows = max(1, (len(items) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 2.6, rows * 2.9), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, it in zip(axes.flat, items):
        ax.imshow(Image.open(it["img"]).convert("RGB"))
        ax.set_title(it["title"], fontsize=7.5)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


@figure("memeworld_gallery", "notebooks/00_data_prep.ipynb", ("00_data_prep/gallery.json",),
        "Two memes per interaction type with their SMI labels")
def draw_memeworld_gallery(profile: str):
    g = read_json(_art(profile, "00_data_prep/gallery.json"))
    return _image_grid(g["items"], cols=4)


# ----------------------------------------------------------------------------- models, serving
@figure("models_training_curves", "stage models (lib.embedded_models)",
        ("models/memeworld-clip/training.json", "models/memeworld-vlm/training.json", "models/metrics.json"),
        "Training loss of the two embedded models, with their held-out figures", optional=True)
def draw_models_training_curves(profile: str):
    clip = read_json(_art(profile, "models/memeworld-clip/training.json"))
    vlm = read_json(_art(profile, "models/memeworld-vlm/training.json"))
    return curve_figure(clip["curve"], vlm["curve"], read_json(_art(profile, "models/metrics.json")), profile)


@figure("serving_throughput", "stage serving (lib.serving)", ("serving/metrics.json",),
        "Completion tokens per second: llama.cpp server vs transformers, same GGUF")
def draw_serving_throughput(profile: str):
    preset = load_profile(profile).get("serving", {}).get("served_preset", "served model")
    return throughput_figure(read_json(_art(profile, "serving/metrics.json")), preset)


# ----------------------------------------------------------------------------- 01 captioning
@figure("captioning_examples", "notebooks/01_captioning.ipynb", ("01_captioning/examples.json",),
        "Caption sources and grounding boxes on six memes")
def draw_captioning_examples(profile: str):
    import matplotlib.patches as mpatches
    import matplotlib.pyplot as plt
    ex = read_json(_art(profile, "01_captioning/examples.json"))
    fig, axes = plt.subplots(2, 3, figsize=(12, 7.5))
    for ax in axes.ravel():
        ax.axis("off")
    for ax, e in zip(axes.ravel(), ex["items"]):
        ax.imshow(Image.open(e["img"]).convert("RGB"))
        for b in e["boxes"]:
            x0, y0, x1, y1 = b["box"]
            ax.add_patch(mpatches.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, lw=1.5, ec="tab:orange"))
            ax.text(x0 + 1, y1 - 2, b["tag"], fontsize=6, color="tab:orange")
        lines = [f"{c}: {t}" for c, t in e["captions"].items()]
        ax.set_title("\n".join(line if len(line) < 70 else line[:67] + "..." for line in lines), fontsize=7, loc="left")
    fig.suptitle(f"Caption sources and boxes per meme (profile {profile})", fontsize=10)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- 02 TRACE
def _trace_runs(profile: str, dataset: str = "fhm") -> dict[str, dict[str, Any]]:
    out = {}
    d = _art(profile, "02_finetuning/runs")
    names = read_json(_art(profile, "02_finetuning/variants.json")) if _art(profile, "02_finetuning/variants.json").exists() \
        else {p.name: p.name for p in sorted(d.glob(f"{dataset}_*"))}
    for label, folder in names.items():
        f = d / folder / "result.json"
        if f.exists():
            out[label] = read_json(f)
    return out


@figure("trace_selected_caption_share", "notebooks/02_finetuning.ipynb", ("02_finetuning/selected_share.csv",),
        "Which candidate each TRACE variant selects: training picks, inference weights, argmax")
def draw_trace_selected_caption_share(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    share = pd.read_csv(_art(profile, "02_finetuning/selected_share.csv"), index_col=[0, 1])
    views = list(dict.fromkeys(share.index.get_level_values(0)))
    n = len(share.loc[views[0]])
    fig, axes = plt.subplots(1, len(views), figsize=(14, 0.42 * n + 1.4), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, view in zip(axes, views):
        sub = share.loc[view]
        left = np.zeros(len(sub))
        for k, col in enumerate(sub.columns):
            ax.barh(sub.index, sub[col].fillna(0), left=left, color=_tab10(k), label=col)
            left += sub[col].fillna(0).values
        ax.set(xlim=(0, 1), title=view)
    axes[0].invert_yaxis()
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, title="candidate")
    fig.suptitle("Which candidate each variant selects (test_seen)", y=1.02)
    return fig


@figure("trace_per_type_accuracy", "notebooks/02_finetuning.ipynb", ("02_finetuning/per_type.csv",),
        "TRACE variants: accuracy per interaction type on test_seen", optional=True)
def draw_trace_per_type_accuracy(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    pt = pd.read_csv(_art(profile, "02_finetuning/per_type.csv"), dtype={"type": str}).set_index("type")
    n_type = pt.pop("n")
    fig, ax = plt.subplots(figsize=(11, 3.8))
    w = 0.85 / pt.shape[1]
    for k, name in enumerate(pt.columns):
        ax.bar(np.arange(len(pt)) + (k - (pt.shape[1] - 1) / 2) * w, pt[name], w, color=_tab10(k), label=name)
    ax.set_xticks(np.arange(len(pt)), [f"{t}\nn={n_type[t]}" for t in pt.index])
    ax.set(xlabel="interaction type (text, image, final)", ylabel="accuracy (test_seen)", ylim=(0, 1.02))
    ax.set_title("TRACE: accuracy per interaction type", pad=8)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig


@figure("trace_training_curves", "notebooks/02_finetuning.ipynb", ("02_finetuning/variants.json",),
        "TRACE training curves: validation AUROC (restored epoch starred) and training loss")
def draw_trace_training_curves(profile: str):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    runs = _trace_runs(profile)
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    for k, (name, r) in enumerate(runs.items()):
        ep = [c["epoch"] for c in r["curve"]]
        axes[0].plot(ep, [c["val_auroc"] for c in r["curve"]], marker="o", ms=3, color=_tab10(k), label=name)
        axes[1].plot(ep, [c["loss"] for c in r["curve"]], marker="o", ms=3, color=_tab10(k), label=name)
        axes[0].plot([r["fit"]["best_epoch"]], [r["curve"][r["fit"]["best_epoch"] - 1]["val_auroc"]], "k*", ms=8)
    for ax, yl in zip(axes, ("validation AUROC (star: restored epoch)", "training loss")):
        ax.set(xlabel="epoch", ylabel=yl)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.suptitle("Training curves", y=1.02)
    return fig


@figure("trace_seeds", "notebooks/02_finetuning.ipynb", ("02_finetuning/seeds.csv",),
        "TRACE's default and its loss ablations over seeds: each seed's test_seen accuracy, mean and sd")
def draw_trace_seeds(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    t = pd.read_csv(_art(profile, "02_finetuning/seeds.csv"))
    variants = list(dict.fromkeys(t.variant))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, col, label in ((axes[0], "accuracy", "accuracy (test_seen)"), (axes[1], "acc_type_001", "accuracy on type 001")):
        for k, v in enumerate(variants):
            g = t[t.variant == v][col]
            ax.scatter([k] * len(g), g, color=_tab10(k), alpha=0.7, zorder=3)
            ax.errorbar([k + 0.15], [g.mean()], yerr=[g.std() if len(g) > 1 else 0], fmt="s", color="k", capsize=4)
            ax.annotate(f"{g.mean():.3f} ± {g.std():.3f}", (k + 0.2, g.mean()), fontsize=7, va="center")
        ax.set_xticks(range(len(variants)), variants)
        ax.set_xlim(-0.5, len(variants) - 0.2)
        ax.set_ylabel(label)
    n = int(t.groupby("variant").size().min())
    fig.suptitle(f"TRACE over {n} seeds: dots are seeds, squares mean ± sd", fontsize=10)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- 03 CLIP4DM
@figure("clip4dm_epsilon_sweep", "notebooks/03_clip4dm.ipynb", ("03_clip4dm/epsilon_sweep.csv",),
        "Choosing CLIP4DM's epsilon on the validation copy of HAT")
def draw_clip4dm_epsilon_sweep(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    sweep = pd.read_csv(_art(profile, "03_clip4dm/epsilon_sweep.csv"))
    chosen = float(sweep.loc[sweep["chosen"].astype(bool), "epsilon"].iloc[0])
    encoder = (load_profile(profile).get("03_clip4dm", {}).get("encoders") or ["encoder"])[0]
    fig, ax = plt.subplots(figsize=(7, 3.2))
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
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig


@figure("clip4dm_backbones", "notebooks/03_clip4dm.ipynb", ("03_clip4dm/by_encoder.csv",),
        "CLIP4DM per encoder: FOIL and nocaps-FOIL localisation and detection, the paper's values marked")
def draw_clip4dm_backbones(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    t = pd.read_csv(_art(profile, "03_clip4dm/by_encoder.csv"))
    cols = [c for c in ("FOIL LA", "FOIL AP (F-CLIPScore)", "nocaps LA", "nocaps AP (F-CLIPScore)") if c in t.columns]
    ours, paper = t[t.source == "this run"], t[t.source == "paper"].set_index("encoder")
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(cols), 3.2))
    w = 0.8 / max(1, len(ours))
    for k, (_, r) in enumerate(ours.iterrows()):
        xs = np.arange(len(cols)) + (k - (len(ours) - 1) / 2) * w
        ax.bar(xs, [r[c] for c in cols], width=w, color=_tab10(k), label=r["encoder"])
        if r["encoder"] in paper.index:
            ax.scatter(xs, [paper.loc[r["encoder"], c] for c in cols], marker="D", color="k", s=18, zorder=3,
                       label="paper" if k == 0 or "paper" not in ax.get_legend_handles_labels()[1] else None)
    ax.set_xticks(range(len(cols)), cols, fontsize=8)
    ax.set(ylim=(0, 1.02), ylabel="share / AP", title=f"CLIP4DM by encoder (profile {profile})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig


@figure("clip4dm_nocaps_domains", "notebooks/03_clip4dm.ipynb", ("03_clip4dm/foil_table.csv",),
        "FOIL and nocaps-FOIL by domain: localisation (chance marked) and detection AP by two scores")
def draw_clip4dm_nocaps_domains(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    t = pd.read_csv(_art(profile, "03_clip4dm/foil_table.csv"))
    t = t[(t.benchmark == "foil") | t.benchmark.str.startswith("nocaps_foil/")]
    labels = ["FOIL" if b == "foil" else b.replace("nocaps_foil/", "nocaps-FOIL\n") for b in t.benchmark]
    cols = {"la": "LA", "ap_clipscore": "AP (CLIPScore)", "ap_fclipscore": "AP (F-CLIPScore)"}
    fig, ax = plt.subplots(figsize=(7.5, 3.3))
    w = 0.8 / len(cols)
    for k, (c, name) in enumerate(cols.items()):
        xs = np.arange(len(t)) + (k - (len(cols) - 1) / 2) * w
        ax.bar(xs, t[c], width=w, color=_tab10(k), label=name)
        if c == "la":
            ax.scatter(xs, t["la_chance"], marker="_", s=120, color="k", zorder=3, label="LA chance (any word)")
            if "la_chance_content" in t:
                ax.scatter(xs, t["la_chance_content"], marker="_", s=120, color="tab:red", zorder=3,
                           label="LA chance (content words)")
    ax.axhline(0.5, color="grey", ls=":", lw=0.8, label="AP chance")
    ax.set_xticks(range(len(t)), labels, fontsize=8)
    ax.set(ylim=(0, 1.02), ylabel="share / AP",
           title="nocaps-FOIL: in-domain (known objects), near (some novel), out (all novel)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig


@figure("clip4dm_hard_negatives", "notebooks/03_clip4dm.ipynb", ("03_clip4dm/hard_negatives.csv",),
        "The F-CLIPScore ablation for the main model and two leak-free models, with and without hard negatives",
        optional=True)
def draw_clip4dm_hard_negatives(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    t = pd.read_csv(_art(profile, "03_clip4dm/hard_negatives.csv"))
    t = t[t.metric != "LA"]
    benches = list(dict.fromkeys(t.benchmark))
    models, scores = list(dict.fromkeys(t.model)), list(dict.fromkeys(t.metric))
    fig, axes = plt.subplots(1, len(benches), figsize=(5.2 * len(benches), 3.4), sharey=True, squeeze=False)
    w = 0.8 / len(scores)
    for ax, b in zip(axes[0], benches):
        sub = t[t.benchmark == b].set_index(["model", "metric"])["value"]
        for k, sc in enumerate(scores):
            xs = np.arange(len(models)) + (k - (len(scores) - 1) / 2) * w
            ax.bar(xs, [sub.get((m, sc), np.nan) for m in models], width=w, color=_tab10(k),
                   label=sc if ax is axes[0][0] else None)
        ax.axhline(0.5, color="grey", ls=":", lw=0.8)
        ax.set_xticks(range(len(models)), [m.replace(", ", ",\n").replace(" (", "\n(") for m in models], fontsize=7)
        ax.set(title={"foil": "FOIL", "nocaps_foil": "nocaps-FOIL"}.get(b, b), ylim=(0, 1.02))
    axes[0][0].set_ylabel("AP, originals vs foils")
    fig.legend(loc="upper left", bbox_to_anchor=(1.0, 0.9), fontsize=8)
    fig.suptitle("Which score separates originals from foils, by how the model was trained", fontsize=10)
    fig.tight_layout()
    return fig


@figure("clip4dm_word_attributions", "notebooks/03_clip4dm.ipynb", ("03_clip4dm/examples.json",),
        "CLIP4DM word attributions of original and foil captions, the swapped word outlined")
def draw_clip4dm_word_attributions(profile: str):
    import matplotlib.pyplot as plt
    ex = read_json(_art(profile, "03_clip4dm/examples.json"))
    items = ex["items"]
    fig, axes = plt.subplots(len(items), 3, figsize=(12, 2.3 * len(items)),
                             gridspec_kw={"width_ratios": [0.6, 2, 2]}, squeeze=False)
    for row, pair in zip(axes, items):
        row[0].imshow(Image.open(pair["img"]).convert("RGB"))
        row[0].axis("off")
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
    fig.tight_layout()
    return fig


@figure("clip4dm_score_distributions", "notebooks/03_clip4dm.ipynb", ("03_clip4dm/results_foil.csv",),
        "FOIL: precision-recall of three caption scores, and F-CLIPScore by caption kind")
def draw_clip4dm_score_distributions(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    res = pd.read_csv(_art(profile, "03_clip4dm/results_foil.csv"))
    orig = ~res["is_foil"].astype(bool).to_numpy()
    scores = {"CLIPScore": res["clip_score"].to_numpy(), "sum of negative attributions": res["sum_negative_attribution"].to_numpy(),
              "F-CLIPScore": res["f_clipscore"].to_numpy()}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    for k, (name, sc) in enumerate(scores.items()):
        pr, rc = precision_recall_points(sc, orig)
        axes[0].plot(rc, pr, color=_tab10(k), label=f"{name} (AP {average_precision(sc, orig):.3f})")
    axes[0].axhline(orig.mean(), color="grey", ls=":", lw=0.8, label="chance")
    axes[0].set(xlabel="recall (original captions)", ylabel="precision", title="FOIL: originals vs foils", ylim=(0, 1.02))
    axes[0].legend(fontsize=7, loc="lower left")
    f = scores["F-CLIPScore"]
    bins = np.concatenate([-np.logspace(np.log10(max(1e-8, -f.min())), -8, 30), [0]])
    for lab, mask in (("original", orig), ("foil", ~orig)):
        axes[1].hist(f[mask], bins=np.unique(bins), histtype="step", density=False, label=lab)
    axes[1].set_xscale("symlog", linthresh=1e-6)
    axes[1].set(xlabel="F-CLIPScore (symlog)", ylabel="captions", title="F-CLIPScore by caption kind")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- 04 few-shot
def _fewshot_preds(profile: str, dataset: str = "fhm"):
    """Notebook 04's predictions of its first model (the rows its figures pool)."""
    rows = [json.loads(x) for x in _art(profile, f"04_few_shot/predictions_{dataset}.jsonl").read_text().splitlines()]
    first = rows[0].get("model") if rows else None
    fields = Prediction.__dataclass_fields__
    return [Prediction(**{k: v for k, v in r.items() if k in fields}) for r in rows if r.get("model") == first]


def _fewshot_main_answers(profile: str, dataset: str = "fhm"):
    """The answers of notebook 04's main setting (one per test meme): what its §7 figures analyse."""
    from lib.sei_report import main_setting_name  # lazy: sei_report loads the agent trainer (torch)
    st = read_json(_art(profile, "04_few_shot/settings.json"))
    main = main_setting_name(st["retrievers"], st["shots"])
    return [p for p in _fewshot_preds(profile, dataset) if p.setting == main], main


@figure("few_shot_agents", "notebooks/04_few_shot.ipynb", ("04_few_shot/table3.json",),
        "Table 3: each fine-tuned agent beside the nearest-training-meme baseline")
def draw_few_shot_agents(profile: str):
    import matplotlib.pyplot as plt
    rows3 = read_json(_art(profile, "04_few_shot/table3.json"))["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    for ax, m in zip(axes, ["rouge_l", "semsim"]):
        x = np.arange(len(rows3))
        ax.bar(x - 0.2, [r[m] for r in rows3], 0.4, label="agent")
        ax.bar(x + 0.2, [r[f"baseline_{m}"] for r in rows3], 0.4, label="nearest training meme")
        ax.set_xticks(x, [r["agent"] for r in rows3])
        ax.set_title({"rouge_l": "ROUGE-L", "semsim": "semantic similarity"}[m], fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Table 3: agents on held-out memes ({profile})", fontsize=10)
    return fig


@figure("few_shot_accuracy", "notebooks/04_few_shot.ipynb", ("04_few_shot/results.json", "04_few_shot/predictions_fhm.jsonl"),
        "Few-shot accuracy per setting and control, with the majority class and the exemplars' own vote")
def draw_few_shot_accuracy(profile: str):
    from lib.sei_report import plot_controls  # lazy: sei_report loads the agent trainer (torch)
    res = read_json(_art(profile, "04_few_shot/results.json"))
    preds = _fewshot_preds(profile)
    gold = {p.id: p.gold for p in preds}
    share = float(np.mean(list(gold.values())))
    first = next(iter(res))
    prefix = first.split(" · ")[0] + " · " if " · " in first else ""       # several models: the first one's rows
    settings = {k[len(prefix):]: v for k, v in res.items() if k.startswith(prefix) and "knn_vote" not in k}
    knn = next((v["acc"] for k, v in res.items() if k.endswith("knn_vote")), None)
    model = json.loads(_art(profile, "04_few_shot/predictions_fhm.jsonl").read_text().splitlines()[0]).get("model", "")
    return plot_controls(settings, max(share, 1 - share), knn,
                         f"Few-shot accuracy, {model} ({profile}, {len(gold)} test memes)")


@figure("few_shot_lexical", "notebooks/04_few_shot.ipynb", ("04_few_shot/predictions_fhm.jsonl", "04_few_shot/settings.json"),
        "Figure 3 analogue: length, type-token ratio and perplexity of generated texts, by outcome")
def draw_few_shot_lexical(profile: str):
    from lib import sei_report as rep  # lazy: sei_report loads the agent trainer (torch)
    p4 = load_profile(profile).get("04_few_shot", {})
    answers, main = _fewshot_main_answers(profile)
    ci = rep.ci_frame(rep.analysis_frame(answers), n_resamples=p4.get("ci_resamples", 1000),
                      method=p4.get("ci_method", "BCa"), seed=p4.get("seed", 0))
    return rep.plot_lexical(ci, f"Figure 3 analogue: {main}, one answer per meme")


@figure("few_shot_coherence", "notebooks/04_few_shot.ipynb", ("04_few_shot/coherence.csv",),
        "Figure 4 analogue: explanation-intervention coherence for correct and wrong hateful calls")
def draw_few_shot_coherence(profile: str):
    import matplotlib.pyplot as plt
    import pandas as pd
    coh = pd.read_csv(_art(profile, "04_few_shot/coherence.csv"))
    fig, ax = plt.subplots(figsize=(4, 3))
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


@figure("few_shot_sentiment", "notebooks/04_few_shot.ipynb", ("04_few_shot/predictions_fhm.jsonl", "04_few_shot/settings.json"),
        "Figure 5 analogue: VADER sentiment classes of generated texts")
def draw_few_shot_sentiment(profile: str):
    from lib import sei_report as rep  # lazy: sei_report loads the agent trainer (torch)
    answers, main = _fewshot_main_answers(profile)
    return rep.plot_sentiment(rep.analysis_frame(answers), f"Figure 5 analogue: VADER sentiment ({main})")


@figure("few_shot_wordshift", "notebooks/04_few_shot.ipynb", ("04_few_shot/predictions_fhm.jsonl", "04_few_shot/settings.json"),
        "Figure 6 analogue: Shannon-entropy word shift of explanations, predicted hateful vs not")
def draw_few_shot_wordshift(profile: str):
    import matplotlib.pyplot as plt

    from lib import sei_report as rep  # lazy: sei_report loads the agent trainer (torch)
    ana = rep.analysis_frame(_fewshot_main_answers(profile)[0])
    expl = ana[ana.kind == "explanation"]
    f_h = tm.word_freqs(expl[expl.subgroup.isin(["cp", "wp"])]["text"])
    f_n = tm.word_freqs(expl[expl.subgroup.isin(["cn", "wn"])]["text"])
    fig, ax = plt.subplots(figsize=(5.5, 6))
    if f_h and f_n:
        tm.plot_word_shift(tm.entropy_shift(f_n, f_h), 30, "Figure 6 analogue: Shannon-entropy word shift of explanations",
                           ("predicted non-hateful", "predicted hateful"), ax)
    else:
        ax.text(0.5, 0.5, "no word shift: one side has no explanation", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
    return fig


# ----------------------------------------------------------------------------- 05 debate
def _debate_runs(profile: str) -> dict[str, dict[str, Any]]:
    d = _art(profile, "05_debate")
    runs = {}
    for f in sorted(d.glob("eval_*.json")):
        name = f.stem[len("eval_"):]
        if name == "rerun_check":
            continue
        ev = read_json(f)
        runs[name] = {**ev, "results": results_from_jsonl(d / f"results_{name}.jsonl")}
    order = list(load_profile(profile).get("05_debate", {}).get("variants", {}))     # notebook 05's order
    return dict(sorted(runs.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


@figure("debate_accuracy", "notebooks/05_debate.ipynb", ("05_debate/eval_arcade.json",),
        "ARCADE and its variants against the direct baseline, per difficulty and interaction type")
def draw_debate_accuracy(profile: str):
    runs = _debate_runs(profile)
    gts = [r.gt for r in next(iter(runs.values()))["results"]]
    label, count = Counter(gts).most_common(1)[0]
    fig = plot_accuracy(runs, "corrected", chance=count / len(gts))
    fig.suptitle(f"ARCADE vs the direct baseline ({profile}); dashed: always answering {label} ({count / len(gts):.2f})",
                 fontsize=10, y=1.03)
    return fig


def _claims_figure(csv_path: Path, xlabel: str, items: str):
    """Each claim of a claims.csv (claim, A, B, n, acc and Wilson interval of each, exact McNemar p,
    majority line) as two points with their intervals on one row."""
    import matplotlib.pyplot as plt
    import pandas as pd
    c = pd.read_csv(csv_path)
    c = c[c["exact McNemar p"].notna()].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(9, 0.75 * len(c) + 1.4))
    for k, r in c.iterrows():
        y = len(c) - 1 - k
        for off, side, color in ((0.15, "A", "tab:blue"), (-0.15, "B", "tab:orange")):
            lo, hi = (float(x) for x in r[f"95% CI {side}"].strip("[]").split(","))
            ax.errorbar(r[f"acc {side}"], y + off, xerr=[[r[f"acc {side}"] - lo], [hi - r[f"acc {side}"]]], fmt="o",
                        color=color, capsize=3, label=("A" if side == "A" else "B") if k == 0 else None)
            ax.text(1.02, y + off, r[side], va="center", fontsize=8, color=color, transform=ax.get_yaxis_transform())
        ax.plot([r["majority line"]] * 2, [y - 0.35, y + 0.35], color="grey", ls="--", lw=1,
                label=f"majority line of these {items}" if k == 0 else None)
    ax.set_yticks(range(len(c)), [f"{r['claim']}\n(n={r['n']}, exact McNemar p={r['exact McNemar p']:.3g})"
                                  for _, r in c.iloc[::-1].iterrows()], fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel(xlabel)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


@figure("debate_claims", "notebooks/05_debate.ipynb", ("05_debate/claims.csv",),
        "Each ARCADE claim as a paired comparison: both variants' accuracy with Wilson 95% intervals on the same posts")
def draw_debate_claims(profile: str):
    return _claims_figure(_art(profile, "05_debate/claims.csv"), "accuracy (corrected view), Wilson 95% interval",
                          "posts")


@figure("few_shot_claims", "notebooks/04_few_shot.ipynb", ("04_few_shot/claims.csv",),
        "Each See-Explain-Intervene claim as a paired comparison: both settings' accuracy with Wilson 95% intervals "
        "on the same memes")
def draw_few_shot_claims(profile: str):
    return _claims_figure(_art(profile, "04_few_shot/claims.csv"),
                          "accuracy (an unreadable answer is wrong), Wilson 95% interval", "memes")


@figure("debate_cost", "notebooks/05_debate.ipynb", ("05_debate/eval_arcade.json",),
        "The debate's calls and tokens per sample, by route")
def draw_debate_cost(profile: str):
    return plot_cost(_debate_runs(profile))


# ----------------------------------------------------------------------------- 06 evaluation
def _comparison(profile: str):
    import pandas as pd
    return pd.read_csv(_art(profile, "06_evaluation/comparison.csv"), dtype={"subset": str})


@figure("evaluation_accuracy_forest", "notebooks/06_evaluation.ipynb", ("06_evaluation/comparison.csv", "06_evaluation/common.json"),
        "Every method's accuracy with its 95% bootstrap CI, on the common memes and on its own")
def draw_evaluation_accuracy_forest(profile: str):
    c = read_json(_art(profile, "06_evaluation/common.json"))
    return plot_forest(_comparison(profile), "accuracy", chance=c["majority_acc"],
                       title=f"Accuracy with 95% CIs: {len(c['ids'])} common memes (filled) and each method's own "
                             f"(open); dashed: majority class")


@figure("evaluation_per_type", "notebooks/06_evaluation.ipynb", ("06_evaluation/comparison.csv",),
        "Accuracy per interaction type for every method on the common memes")
def draw_evaluation_per_type(profile: str):
    t = _comparison(profile)
    n = int(t[(t.memes == "common") & (t.subset == "all")].n.max())
    return plot_type_heatmap(t, "common", f"Accuracy per interaction type, {n} common memes")


@figure("evaluation_mcnemar", "notebooks/06_evaluation.ipynb", ("06_evaluation/mcnemar.csv",),
        "McNemar for every pair of methods on the common memes, multiple-comparison corrected")
def draw_evaluation_mcnemar(profile: str):
    import pandas as pd
    return plot_mcnemar(pd.read_csv(_art(profile, "06_evaluation/mcnemar.csv")),
                        "McNemar on the common memes (adjusted; * significant)")


@figure("evaluation_injection", "notebooks/06_evaluation.ipynb", ("06_evaluation/injection.csv",),
        "Prompt injection: flip rates with the neutral control and the mitigation")
def draw_evaluation_injection(profile: str):
    import pandas as pd
    return plot_flips(pd.read_csv(_art(profile, "06_evaluation/injection.csv")),
                      "Prompt injection: flip rates (red: instruction, grey: neutral control, green: mitigated)")


@figure("evaluation_error_gallery", "notebooks/06_evaluation.ipynb", ("06_evaluation/gallery.json",),
        "The common memes most methods get wrong")
def draw_evaluation_error_gallery(profile: str):
    import matplotlib.pyplot as plt
    gallery = read_json(_art(profile, "06_evaluation/gallery.json"))
    fig, axes = plt.subplots(1, max(1, len(gallery)), figsize=(2.6 * max(1, len(gallery)), 3.4), squeeze=False)
    for ax, g in zip(axes[0], gallery):
        ax.imshow(Image.open(g["img"]).convert("RGB"))
        ax.set_axis_off()
        ax.set_title(f"{g['id']} type {g['type']} gold {g['label']}\nwrong: {g['share wrong']:.0%} of methods", fontsize=7)
    fig.suptitle("Error gallery: the common memes most methods get wrong", fontsize=10)
    return fig


# ----------------------------------------------------------------------------- notebook 07
def redraw_all(profile: str, progress: bool = True, root: Path | None = None) -> list[dict[str, Any]]:
    """Draw every figure whose artifacts exist, save it (under `root`/<profile>/, default
    figures/), and return one index row per figure (name, notebook, artifacts, caption, status)."""
    import matplotlib.pyplot as plt
    rows = []
    for f in tqdm(list(REGISTRY.values()), desc="figures", disable=not progress):
        missing = [a for a in f.artifacts if not _art(profile, a).exists()]
        if missing:
            rows.append({"name": f.name, "notebook": f.notebook, "artifacts": f.artifacts, "caption": f.caption,
                         "status": f"not drawn: artifacts/{profile}/{missing[0]} missing"})
            continue
        fig = f.draw(profile)
        plotting.save_figure(fig, f.name, profile, root)
        plt.close(fig)
        rows.append({"name": f.name, "notebook": f.notebook, "artifacts": f.artifacts, "caption": f.caption,
                     "status": "drawn"})
    return rows


def write_index(rows: list[dict[str, Any]], profiles: tuple[str, ...] = ("embedded", "paper"),
                root: Path | None = None) -> Path:
    """figures/README.md (under `root` when given): a table of every figure, the notebook and
    artifacts it comes from, and a link for each profile that has it."""
    root = Path(root or ROOT / "figures")
    have = {p: {x.stem for x in (root / p).glob("*.png")} for p in profiles}
    lines = ["# Figures", "",
             "Every figure of the compendium, redrawn from artifacts alone by `notebooks/07_figures.ipynb`",
             "(`make reproduce NB=07`): PNG and PDF under `figures/<profile>/`. This index is written by that notebook.",
             "", "| figure | what it shows | notebook | artifacts | " + " | ".join(profiles) + " |",
             "|---|---|---|---|" + "---|" * len(profiles)]
    for r in rows:
        cells = [f"`{r['name']}`", r["caption"], r["notebook"], ", ".join(f"`{a}`" for a in r["artifacts"])]
        cells += [f"[png]({p}/{r['name']}.png)" if r["name"] in have[p] else "—" for p in profiles]
        lines.append("| " + " | ".join(cells) + " |")
    return write_text(root / "README.md", "\n".join(lines) + "\n")
