"""Notebook 00's figures: what each unimodal reader of MemeWorld gets right, and a gallery of memes.
"""
from __future__ import annotations

from lib.compendium.artifacts import read_json
from lib.evaluation.figure_kit import art_path, figure, laid_out, legend_outside, show_image, subplots


# ----------------------------------------------------------------------------- 00 data
@figure("memeworld_unimodal_readers", "notebooks/00_data_prep.ipynb", ("memeworld_datasheet",),
        "MemeWorld: accuracy of the Bayes reader of one modality per interaction type", optional=True)
def draw_memeworld_unimodal_readers(profile: str):
    import pandas as pd
    sheet = read_json(art_path(profile, "memeworld_datasheet"))
    per_type = pd.DataFrame(sheet["bayes_readers"]).round(3).drop(index="overall")
    fig, ax = subplots(figsize=(9, 3.4))
    colors = {"text_only": "tab:blue", "image_only": "tab:orange", "rule_reader": "tab:green"}
    w = 0.27
    for k, col in enumerate(per_type.columns):
        ax.bar([x + (k - 1) * w for x in range(len(per_type))], per_type[col], w, color=colors.get(col), label=col)
    ax.set_xticks(range(len(per_type)), per_type.index)
    ax.set(xlabel="interaction type (text, image, final)", ylabel="accuracy on test", ylim=(0, 1.02))
    ax.set_title("MemeWorld: the Bayes reader of one modality, per type (not a per-type bound)", pad=8)
    return legend_outside(ax)


def _image_grid(items: list[dict[str, str]], cols: int = 4, title: str = ""):
    """A grid of images (items: {img, title})."""
    rows = max(1, (len(items) + cols - 1) // cols)
    fig, axes = subplots(rows, cols, figsize=(cols * 2.6, rows * 2.9), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, it in zip(axes.flat, items):
        show_image(ax, it["img"], it["title"])
    return laid_out(fig, title or None)


@figure("memeworld_gallery", "notebooks/00_data_prep.ipynb", ("data_gallery",),
        "Two memes per interaction type with their SMI labels", images=True)
def draw_memeworld_gallery(profile: str):
    g = read_json(art_path(profile, "data_gallery"))
    return _image_grid(g["items"], cols=4)
