"""Every figure of the compendium, drawn from artifacts alone.

Each figure is a function `draw_<name>(profile) -> matplotlib Figure` that reads only files under
`artifacts/<profile>/` (never a model, never a dataset loader); the notebook that produces the
artifacts calls `figures.show(name, profile)` once they are written, and notebook 07 redraws all
of them the same way, then writes the index `figures/README.md`.

    from lib.evaluation import figures
    figures.show("trace_training_curves", "embedded")     # draw, save PNG + PDF, show inline
    figures.redraw_all("embedded")                        # notebook 07
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

# each paper's figures register themselves when their module is imported; this order is the index's
from lib.data import figures as _data_figures  # noqa: F401
from lib.models import figures as _models_figures  # noqa: F401
from lib.trace import figures as _trace_figures  # noqa: F401
from lib.clip4dm import figures as _clip4dm_figures  # noqa: F401
from lib.sei import figures as _sei_figures  # noqa: F401
from lib.arcade import figures as _arcade_figures  # noqa: F401
from lib.compendium.artifacts import PUBLISHED_PROFILES, RESULTS_ROOT, figures_dir, figures_index, read_json, write_text
from lib.evaluation import plotting
from lib.evaluation.crosseval import plot_flips, plot_forest, plot_mcnemar, plot_type_heatmap
from lib.evaluation.figure_kit import (REGISTRY, Figure, art_frame, art_path, available, figure,  # noqa: F401
                                       reading_from, show, show_image, subplots)

__all__ = ["REGISTRY", "Figure", "art_path", "available", "figure", "reading_from", "show", "redraw_all", "write_index"]


# ----------------------------------------------------------------------------- 06 evaluation
def _comparison(profile: str):
    return art_frame(profile, "evaluation_comparison", read_csv={"dtype": {"subset": str}})


@figure("evaluation_accuracy_forest", "notebooks/06_evaluation.ipynb", ("evaluation_comparison", "evaluation_common"),
        "Every method's accuracy with its 95% bootstrap CI, on the common memes and on its own")
def draw_evaluation_accuracy_forest(profile: str):
    c = read_json(art_path(profile, "evaluation_common"))
    return plot_forest(_comparison(profile), "accuracy", chance=c["majority_acc"],
                       title=f"Accuracy with 95% CIs: {len(c['ids'])} common memes (filled) and each method's own "
                             f"(open); dashed: majority class")


@figure("evaluation_per_type", "notebooks/06_evaluation.ipynb", ("evaluation_comparison",),
        "Accuracy per interaction type for every method on the common memes")
def draw_evaluation_per_type(profile: str):
    t = _comparison(profile)
    n = int(t[(t.memes == "common") & (t.subset == "all")].n.max())
    return plot_type_heatmap(t, "common", f"Accuracy per interaction type, {n} common memes")


@figure("evaluation_mcnemar", "notebooks/06_evaluation.ipynb", ("evaluation_mcnemar",),
        "McNemar for every pair of methods on the common memes, multiple-comparison corrected")
def draw_evaluation_mcnemar(profile: str):
    return plot_mcnemar(art_frame(profile, "evaluation_mcnemar"),
                        "McNemar on the common memes (adjusted; * significant)")


@figure("evaluation_injection", "notebooks/06_evaluation.ipynb", ("evaluation_injection",),
        "Prompt injection: flip rates with the neutral control and the mitigation")
def draw_evaluation_injection(profile: str):
    return plot_flips(art_frame(profile, "evaluation_injection"),
                      "Prompt injection: flip rates (red: instruction, grey: neutral control, green: mitigated)")


@figure("evaluation_error_gallery", "notebooks/06_evaluation.ipynb", ("evaluation_gallery",),
        "The common memes most methods get wrong", images=True)
def draw_evaluation_error_gallery(profile: str):
    gallery = read_json(art_path(profile, "evaluation_gallery"))
    fig, axes = subplots(1, max(1, len(gallery)), figsize=(2.6 * max(1, len(gallery)), 3.4), squeeze=False)
    for ax, g in zip(axes[0], gallery):
        show_image(ax, g["img"], f"{g['id']} type {g['type']} gold {g['label']}\nwrong: {g['share wrong']:.0%} of methods",
                   fontsize=7)
    fig.suptitle("Error gallery: the common memes most methods get wrong", fontsize=10)
    return fig


# ----------------------------------------------------------------------------- notebook 07
def redraw_all(profile: str, progress: bool = True, root: Path | None = None) -> list[dict[str, Any]]:
    """Draw every figure whose artifacts exist, save it (under `root`/<profile>/, default
    figures/), and return one index row per figure (name, notebook, artifacts, caption, status)."""
    import matplotlib.pyplot as plt
    rows = []
    for f in tqdm(list(REGISTRY.values()), desc="figures", disable=not progress):
        missing = f.missing(profile)
        if missing:
            rows.append({"name": f.name, "notebook": f.notebook, "artifacts": f.relpaths(), "caption": f.caption,
                         "status": f"not drawn: artifacts/{profile}/{missing[0]} missing"})
            continue
        fig = f.draw(profile)
        plotting.save_figure(fig, f.name, profile, root)
        plt.close(fig)
        rows.append({"name": f.name, "notebook": f.notebook, "artifacts": f.relpaths(), "caption": f.caption,
                     "status": "drawn"})
    return rows


class FiguresNotDrawn(RuntimeError):
    """A figures run drew nothing, or left out a figure whose inputs the profile's committed results hold."""


def require_drawn(rows: list[dict[str, Any]], profile: str) -> None:
    """Fail a figures run that drew fewer figures than it has inputs for: none at all, or a figure not drawn
    whose inputs the committed results (results/<profile>/) hold (`make reproduce NB=07` takes them from there)."""
    drawn = [r for r in rows if r["status"] == "drawn"]
    if not drawn:
        raise FiguresNotDrawn(f"no figure drawn for profile {profile}: every figure's inputs are missing under "
                              f"artifacts/{profile}/ ({rows[0]['status'] if rows else 'no figure registered'})")
    held = [r["name"] for r in rows if r["status"] != "drawn" and not REGISTRY[r["name"]].optional
            and all((RESULTS_ROOT / profile / rel).exists() or (RESULTS_ROOT / profile / (rel + ".gz")).exists()
                    for rel in r["artifacts"])]
    if held:
        raise FiguresNotDrawn(f"{len(held)} figures not drawn although results/{profile}/ holds their inputs: "
                              f"{', '.join(held)} (make reproduce NB=07 takes them from there)")


def _link(folder: Path, base: Path) -> str:
    """The relative link prefix from `base` to `folder` ("" when they are the same folder)."""
    rel = Path(os.path.relpath(folder, base)).as_posix()
    return "" if rel == "." else rel + "/"


def write_index(rows: list[dict[str, Any]], profiles: tuple[str, ...] = ("embedded", "paper"),
                root: Path | None = None, profile: str | None = None) -> Path:
    """The figure index: a table of every figure, the notebook and artifacts it comes from, and a link
    for each of `profiles` that has it. Written to figures/README.md (`profile` a published profile,
    or None), beside an unpublished profile's figures (artifacts/<profile>/figures/README.md), or to
    `root`/README.md with each profile's figures under `root`/<profile>/."""
    index = Path(root) / "README.md" if root else figures_index(profile or PUBLISHED_PROFILES[0])
    dirs = {p: (Path(root) / p if root else figures_dir(p)) for p in profiles}
    have = {p: {x.stem for x in dirs[p].glob("*.png")} for p in profiles}
    lines = ["# Figures", "",
             "Every figure of the compendium, redrawn from artifacts alone by `notebooks/07_figures.ipynb`",
             "(`make reproduce NB=07`): PNG and PDF under `figures/<profile>/`. This index is written by that notebook.",
             "", "| figure | what it shows | notebook | artifacts | " + " | ".join(profiles) + " |",
             "|---|---|---|---|" + "---|" * len(profiles)]
    for r in rows:
        cells = [f"`{r['name']}`", r["caption"], r["notebook"], ", ".join(f"`{a}`" for a in r["artifacts"])]
        cells += [f"[png]({_link(dirs[p], index.parent)}{r['name']}.png)" if r["name"] in have[p] else "—"
                  for p in profiles]
        lines.append("| " + " | ".join(cells) + " |")
    return write_text(index, "\n".join(lines) + "\n")
