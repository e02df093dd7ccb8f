"""Every number the prose quotes comes from a run: the README, docs/ and every markdown cell of every
notebook. A number (integers included) must round to a number printed in the saved notebooks' outputs,
held in the committed results (results/: metrics, tables, timings, make test's record) or set by the
embedded profile (params/embedded.yaml: sizes such as 96 memes or 5 seeds are the run's own), or be
one of the few exempt forms below. Prose left behind when a run's numbers changed fails here.

Exempt, as not quoting a run:
- code (fenced blocks and `inline code`), link targets, HTML comments and the generated blocks (they are
  checked against the results by tests/test_results.py);
- sentences (and table columns headed so) that quote a paper: their numbers are the paper's;
- identifiers: numbers glued to letters or to "/", "-", "." (ViT-L/14, SmolLM2-135M, Python 3.11,
  notebook stems such as 04_few_shot), section and notebook numbers ("notebook 04", "Table 2", "§7");
- DERIVED: per document, a number and why no output prints it.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml

pytestmark = pytest.mark.results
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DOCS = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "results.md")
#: a number as prose writes it: not part of an identifier; thousands may be grouped with commas
NUM = re.compile(r"(?<![\w./\-:#§^=@$])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w/%]*[A-Za-z_/]|\.\d|,\d{3})"
                 r"|(?<![\w./\-:#§^=@$])-?\d+(?:\.\d+)?(?![\w/]*[A-Za-z_/]|\.\d|,\d{3})")
#: words after which a number names something rather than quoting a run
NAMING = re.compile(r"(?:notebook|notebooks|table|tables|figure|figures|section|stage|step|item|issue|line|lines|"
                    r"column|row|type|types|appendix|equation|eq\.|version|top|round|rounds|k =|n =|HTTP|a|an|"
                    r"status|port|layer|layers)\s*$", re.I)
GENERATED = re.compile(r"<!-- (\w+):start -->.*?<!-- \1:end -->", re.S)

#: document -> {number as written: why no output prints it}
DERIVED: dict[str, dict[str, str]] = {
    "03_clip4dm": {"1.2": "the floor-ratio bound the committed-results check asserts"},
    "README.md": {"4": "the budget of make reproduce in hours (the issue's, not a measurement)",
                  "25": "make test's budget in minutes from a fresh clone", "20": "its budget with the venv present",
                  "30": "the results folder's size cap in MB (lib.compendium.results.SIZE_CAP_MB)"},
    "models-and-serving.md": {"401": "an HTTP status code", "403": "an HTTP status code", "429": "an HTTP status code",
                              "10": "InternVL3.5's tile limit (its processor's max_dynamic_patch)",
                              "256": "tokens per InternVL3.5 tile (its configuration)"},
}


def _numbers_in(value) -> list[float]:
    out = []
    if isinstance(value, bool):
        return out
    if isinstance(value, (int, float)):
        out.append(float(value))
    elif isinstance(value, str):
        out += [float(x.replace(",", "")) for x in NUM.findall(value)]
    elif isinstance(value, dict):
        for v in value.values():
            out += _numbers_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out += _numbers_in(v)
    return out


def _outputs(path: Path) -> str:
    out = []
    for c in nbformat.read(str(path), as_version=4).cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            out.append(o.get("text", ""))
            out += [v for k, v in o.get("data", {}).items() if k in ("text/plain", "text/html", "text/markdown")]
    return "\n".join(out)


def _backing() -> list[float]:
    vals = _numbers_in("\n".join(_outputs(p) for p in NOTEBOOKS))
    results = ROOT / "results"
    for f in results.rglob("*"):
        if f.suffix == ".json":
            data = json.loads(f.read_text())
            vals += _numbers_in(data)
            if f.name in ("timings.json", "make_test.json"):        # durations as prose writes them
                secs = [v for v in _numbers_in(data) if v > 0]
                vals += [v / 60 for v in secs] + [v / 3600 for v in secs]
        elif f.suffix == ".csv" and f.stat().st_size < 2_000_000:
            with f.open(encoding="utf-8") as fh:
                for row in csv.reader(fh):
                    vals += _numbers_in(row)
    for page in [ROOT / "docs" / "results.md"]:                   # generated pages and blocks: from code and results
        vals += _numbers_in(page.read_text()) if page.exists() else []
    from lib.compendium.results import BLOCKS
    for blocks in BLOCKS.values():
        for fn in blocks.values():
            vals += _numbers_in(fn("embedded"))
    vals += _numbers_in(yaml.safe_load((ROOT / "params" / "embedded.yaml").read_text()))
    vals += _numbers_in(yaml.safe_load((ROOT / "params" / "ci.yaml").read_text()))
    return vals + [100 * v for v in vals]                    # shares quoted as percentages


def _rounds_to(values: set[float], written: str) -> bool:
    w = written.replace(",", "").lstrip("-")
    d = len(w.split(".")[1]) if "." in w else 0
    target = float(w)
    return any(abs(round(abs(v), d) - target) < 1e-9 or abs(abs(v) - target) < 0.5 * 10 ** -d + 1e-12 for v in values)


def _prose(text: str) -> str:
    """Markdown without code, link targets, comments and generated blocks."""
    text = GENERATED.sub(" ", text)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"https?://\S+", " ", text)
    return text


def _quoted(markdown: str) -> list[tuple[str, str]]:
    """(number, its sentence) for every number the prose quotes from a run."""
    out, prose, header = [], [], None
    for line in _prose(markdown).splitlines():
        if line.lstrip().startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set("".join(cells)) <= set("-: "):
                out += [(n, line.strip()) for h, c in zip(header, cells)
                        if "paper" not in h.lower() or "profile" in h.lower()
                        for n in _plain_numbers(c)]
            continue
        header = None
        prose.append(line.lstrip("#>*- ") if line.lstrip().startswith("#") else line)
    for sentence in re.split(r"(?<=[.;:!?])\s+(?=[A-Z*(\[])", " ".join(prose)):
        if "paper" not in sentence.lower():
            out += [(n, sentence[:110]) for n in _plain_numbers(sentence)]
    return out


def _plain_numbers(text: str) -> list[str]:
    return [m.group(0) for m in NUM.finditer(text) if not NAMING.search(text[:m.start()])]


def _documents():
    for p in NOTEBOOKS:
        md = "\n\n".join(c.source for c in nbformat.read(str(p), as_version=4).cells if c.cell_type == "markdown")
        yield p.stem, md
    for p in DOCS:
        yield p.name, p.read_text()


BACKING: set[float] = set()


@pytest.mark.parametrize("name, markdown", list(_documents()), ids=lambda x: x if isinstance(x, str) and len(x) < 40 else "")
def test_numbers_in_prose_come_from_a_run(name, markdown):
    if not BACKING:
        BACKING.update(_backing())
    derived = DERIVED.get(name, {})
    stale = [(n, where) for n, where in _quoted(markdown) if n not in derived and not _rounds_to(BACKING, n)]
    assert not stale, f"{name}: {len(stale)} numbers that no output, result or profile gives: {stale[:15]}"


def test_the_check_catches_a_stale_number():
    assert _rounds_to({0.8364, 0.5}, "0.836") and _rounds_to({0.8364}, "0.84") and _rounds_to({1141.0}, "1,141")
    assert not _rounds_to({0.8364, 0.5}, "0.849") and not _rounds_to({68.0}, "88")
    text = ("## Reading the results\n\nThe model scores 0.836 on 96 memes. The paper reports 0.807 on\nreal FHM.\n\n"
            "| | paper (FHM) | embedded |\n|---|---|---|\n| accuracy | 0.807 | 0.836 |\n"
            "Notebook 04 runs ViT-L/14 and `eval_n = 96` with SmolLM2-135M.\n")
    assert sorted(n for n, _ in _quoted(text)) == ["0.836", "0.836", "96"]
