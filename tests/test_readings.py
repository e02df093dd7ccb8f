"""Every number a notebook's "Reading the results" quotes comes from a run: it rounds to a number
printed in the saved notebooks' outputs or to a value in the README's results block (generated
from every stage's metrics.json). A reading left behind when a stage's numbers changed fails here.

Exempt: lines that quote the paper (their numbers are the paper's), and the few derived numbers
listed in DERIVED with the reason each is not printed anywhere."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NUM = re.compile(r"(?<![\w.])-?\d+\.\d+(?!\d)")

#: notebook stem -> {number as written: why no output prints it}
DERIVED: dict[str, dict[str, str]] = {
    "03_clip4dm": {"1.2": "the floor-ratio target the test asserts", "12.0": "the paper's pairs/s (REFERENCE.md)",
                   "1.02": "earlier runs' floor ratios, named as such", "1.07": "earlier runs' floor ratios",
                   "1.4": "the floor ratio before the speed-ups (history)", "1.7": "the same",
                   "3.5": "image preprocessing time, profiled once (history)"},
}


def _outputs(path: Path) -> str:
    out = []
    for c in nbformat.read(str(path), as_version=4).cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            out.append(o.get("text", ""))
            out += [v for k, v in o.get("data", {}).items() if k in ("text/plain", "text/html", "text/markdown")]
    return "\n".join(out)


def _results_block() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.find("<!-- results:start -->"):text.find("<!-- results:end -->")]


def _backing() -> list[float]:
    vals = [float(x) for x in NUM.findall("\n".join(_outputs(p) for p in NOTEBOOKS) + _results_block())]
    return vals + [100 * v for v in vals]                    # shares quoted as percentages


def _reading(path: Path) -> str:
    cells = [c.source for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "markdown"]
    return next((s for s in cells if s.lstrip().startswith("## Reading the results")), "")


def _rounds_to(values: list[float], written: str) -> bool:
    d, target = len(written.split(".")[1]), float(written)
    return any(abs(round(v, d) - target) < 1e-9 or abs(v - target) < 0.5 * 10 ** -d + 1e-12 for v in values)


def _quoted(reading: str) -> list[tuple[str, str]]:
    """(number, its sentence) for every number a reading quotes from a run: sentences that mention
    the paper are the paper's numbers, and so are table columns headed "paper"."""
    out, prose, header = [], [], None
    for line in reading.splitlines():
        if line.lstrip().startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set("".join(cells)) <= set("-: "):
                out += [(n, line.strip()) for h, c in zip(header, cells)
                        if "paper" not in h.lower() or "profile" in h.lower() for n in NUM.findall(c)]
            continue
        header = None
        prose.append(line)
    for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z*(])", " ".join(prose)):
        if "paper" not in sentence.lower():
            out += [(n, sentence[:100]) for n in NUM.findall(sentence)]
    return out


BACKING: list[float] = []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_numbers_in_readings_come_from_the_run(path):
    if not BACKING:
        BACKING.extend(_backing())
    reading = _reading(path)
    if not reading:
        pytest.skip(f"{path.name} has no reading")
    derived = DERIVED.get(path.stem, {})
    stale = [(n, where) for n, where in _quoted(reading) if n not in derived and not _rounds_to(BACKING, n.lstrip("-"))]
    assert not stale, f"{path.name}: numbers in the reading that no output or metric gives: {stale}"


def test_the_check_catches_a_stale_number():
    assert _rounds_to([0.8364, 0.5], "0.836") and _rounds_to([0.8364], "0.84")
    assert not _rounds_to([0.8364, 0.5], "0.849")
    text = ("## Reading the results\n\nThe model scores 0.836. The paper reports 0.807 on\nreal FHM.\n\n"
            "| | paper (FHM) | embedded |\n|---|---|---|\n| accuracy | 0.807 | 0.836 |\n")
    assert [n for n, _ in _quoted(text)] == ["0.836", "0.836"]
