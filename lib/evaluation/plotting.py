"""Figures: one style for the compendium, saved as PNG and PDF under figures/<profile>/ (published
profiles) or artifacts/<profile>/figures/ (every other profile: artifacts.figures_dir)."""
from __future__ import annotations

from pathlib import Path

from lib.compendium.artifacts import figures_dir, write_with


def setup() -> None:
    """The compendium's style; inside a Jupyter kernel, figures also render inline (so a saved
    notebook shows them on a git host, whatever MPLBACKEND the runner exported)."""
    import matplotlib
    try:
        from IPython import get_ipython
        ip = get_ipython()
        if ip is not None and getattr(ip, "kernel", None) is not None:
            ip.run_line_magic("matplotlib", "inline")
    except ImportError:
        pass
    import seaborn as sns
    matplotlib.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "savefig.bbox": "tight",
                                "svg.hashsalt": "compendium", "pdf.compression": 6})
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")


def save_figure(fig, name: str, profile: str, root: Path | None = None) -> list[Path]:
    """Write <name>.png and .pdf atomically into the profile's figure folder (artifacts.figures_dir;
    `root`/<profile>/ when given); metadata without timestamps."""
    out_dir = Path(root) / profile if root else figures_dir(profile)
    paths = []
    for ext, meta in (("png", {"Software": None}), ("pdf", {"CreationDate": None, "Producer": None})):
        p = out_dir / f"{name}.{ext}"
        write_with(p, lambda tmp, ext=ext, meta=meta: fig.savefig(tmp, format=ext, metadata=meta))
        paths.append(p)
    return paths


def show(fig, name: str, profile: str) -> None:
    """Save the figure (PNG + PDF in the profile's figure folder) and show it inline; returns nothing, so a
    cell ending with it displays the figure, not a list of paths."""
    import matplotlib.pyplot as plt
    save_figure(fig, name, profile)
    if "inline" in plt.get_backend():
        plt.show()
    else:
        plt.close(fig)
