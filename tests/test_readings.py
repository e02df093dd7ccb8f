"""Every number the prose quotes comes from the output it names: the README, docs/ and every markdown cell of every
notebook. Each paragraph is read against its sources: the notebook it sits in (its saved outputs and its stage's
committed results), the notebooks and stages the paragraph names ("notebook 04", "notebooks 02-07", 05_debate),
or, where it names none, its document's own stages (DOC_STAGES: docs/trace.md reads notebooks 01 and 02). A number
must round to a number printed there, or in the run's records that every page may quote (the profiles' sizes,
timings.json, make test's record). A number that only some other stage's results hold fails: prose that quotes
notebook 05's accuracy under notebook 04's name is caught, and so is prose left behind when a run's numbers changed.

Exempt, as not quoting a run:
- code (fenced blocks and `inline code`), link targets, HTML comments and the generated blocks (they are
  checked against the results by tests/test_results.py); generated pages (GENERATED_PAGES);
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
#: generated pages: their numbers are the results' (tests/test_results.py) and the analysis plan's own
GENERATED_PAGES = ("results.md", "findings.md", "analysis-plan.md")
DOCS = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in GENERATED_PAGES)
RESULTS = ROOT / "results" / "embedded"
#: a document -> the stages a paragraph that names none reads (a notebook reads its own stage)
DOC_STAGES = {"README.md": ("07_figures",), "trace.md": ("01_captioning", "02_finetuning"), "clip4dm.md": ("03_clip4dm",),
              "see-explain-intervene.md": ("04_few_shot",), "arcade.md": ("05_debate",),
              "evaluation.md": ("06_evaluation", "07_figures"), "models-and-serving.md": ("models", "serving"),
              "profiles-and-data.md": ("00_data_prep",), "layout.md": ("checks",), "gpu-costs.md": ("gpu",)}
#: how a paragraph names a notebook or a stage
NAMED = re.compile(r"\bnotebooks?\s+(0\d(?:\s*(?:,|and|or|to|-|–|through)\s*0\d)*)|\b(0\d)_[a-z]+|\bNB=(0\d)"
                   r"|\b(models) stage|\b(serving) (?:stage|benchmark|table)", re.I)
#: a number as prose writes it: not part of an identifier; thousands may be grouped with commas
NUM = re.compile(r"(?<![\w./\-:#§^=@$])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w/%]*[A-Za-z_/]|\.\d|,\d{3})"
                 r"|(?<![\w./\-:#§^=@$])-?\d+(?:\.\d+)?(?![\w/]*[A-Za-z_/]|\.\d|,\d{3})")
#: words after which a number names something rather than quoting a run
NAMING = re.compile(r"(?:notebook|notebooks|table|tables|figure|figures|section|stage|step|item|issue|line|lines|"
                    r"column|row|type|types|appendix|equation|eq\.|version|top|round|rounds|k =|n =|HTTP|a|an|"
                    r"status|port|layer|layers)\s*$", re.I)
#: a time unit right after a number ("41 s", "20.5 min", "3.7 hours", "0.6 GPU-hours")
TIME_UNIT = re.compile(r"\s*(?:s|sec|seconds?|min|minutes?|h|hours?|GPU-hours?)\b")
TIMED = "\u23f1"
GENERATED = re.compile(r"<!-- (\w+):start -->.*?<!-- \1:end -->", re.S)

#: document -> {number as written: why no output prints it}
DERIVED: dict[str, dict[str, str]] = {
    "03_clip4dm": {"1.2": "the floor-ratio bound the committed-results check asserts"},
    "00_data_prep": {"600": "nocaps-FOIL's 1,800 scenes over its three domains"},
    "README.md": {"4": "the budget of make reproduce in hours (the issue's, not a measurement)",
                  "6.5": "the virtual environment's size on disk (du), not a run's output",
                  "25": "make test's budget in minutes from a fresh clone", "20": "its budget with the venv present",
                  "30": "the results folder's size cap in MB (lib.compendium.results.SIZE_CAP_MB)"},
    "models-and-serving.md": {"401": "an HTTP status code", "403": "an HTTP status code", "429": "an HTTP status code",
                              "10": "InternVL3.5's tile limit (its processor's max_dynamic_patch)",
                              "256": "tokens per InternVL3.5 tile (its configuration)",
                              "4,032": "Pixtral's image tokens for one meme (lib.compendium.costs' formula)"},
    "profiles-and-data.md": {n: "a count of tests/test_datasets.py's bad-input cases (code, not a run)"
                             for n in ("8", "9", "10", "11", "12", "13", "21")},
    "robustness.md": {"15": "the ci profile's cell timeout (900 s in params/ci.yaml) in minutes",
                      "30": "the ci profile's stage timeout (1500 s floor 1800 s) in minutes"},
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


def _stage_names() -> dict[str, str]:
    """A stage's two-digit number (or name) -> its folder name."""
    out = {p.name[:2]: p.name for p in RESULTS.iterdir() if p.is_dir() and p.name[:2].isdigit()}
    return out | {"models": "models", "serving": "serving"}


def _file_values(folder: Path) -> list[float]:
    vals: list[float] = []
    for f in sorted(folder.rglob("*")) if folder.exists() else []:
        if f.suffix == ".json":
            vals += _numbers_in(json.loads(f.read_text()))
        elif f.suffix == ".csv" and f.stat().st_size < 2_000_000:
            with f.open(encoding="utf-8") as fh:
                for row in csv.reader(fh):
                    vals += _numbers_in(row)
    return vals


SOURCES: dict[str, set[float]] = {}


def _source(stage: str) -> set[float]:
    """The numbers a stage's outputs print: its saved notebook's outputs and its committed results."""
    if stage not in SOURCES:
        vals = _file_values(RESULTS / stage if (RESULTS / stage).exists() else ROOT / "results" / stage)
        nb = ROOT / "notebooks" / f"{stage}.ipynb"
        if nb.exists():
            vals += _numbers_in(_outputs(nb))
        SOURCES[stage] = set(vals) | {100 * v for v in vals}            # shares quoted as percentages
    return SOURCES[stage]


def _records(timed: bool = True) -> set[float]:
    """What every page may quote: the profiles' sizes and the run's records of its own cost; a record's seconds
    read as minutes or hours only where the prose writes a time unit after the number (`timed`), so a small
    number elsewhere is not backed by a time that happens to round to it."""
    key = "records" if timed else "records_untimed"
    if key not in SOURCES:
        vals: list[float] = []
        for name in ("timings.json", "make_test.json"):
            for f in (ROOT / "results").rglob(name):
                secs = [v for v in _numbers_in(json.loads(f.read_text())) if v > 0]
                vals += secs + ([v / 60 for v in secs] + [v / 3600 for v in secs] if timed else [])
        vals += _numbers_in(yaml.safe_load((ROOT / "params" / "embedded.yaml").read_text()))
        vals += _numbers_in(yaml.safe_load((ROOT / "params" / "ci.yaml").read_text()))
        SOURCES[key] = set(vals)
    return SOURCES[key]


def named_stages(paragraph: str) -> set[str]:
    """The stages a paragraph names (its notebooks by number, range or stem; the models and serving stages)."""
    names = _stage_names()
    out: set[str] = set()
    for m in NAMED.finditer(paragraph):
        if m.group(1):
            nums = {int(x) for x in re.findall(r"0\d", m.group(1))}          # each one named, and each range
            for a, b in re.findall(r"(0\d)\s*(?:-|–|to|through)\s*(0\d)", m.group(1)):
                nums |= set(range(int(a), int(b) + 1))
            out |= {names[f"{k:02d}"] for k in nums if f"{k:02d}" in names}
        for g in m.groups()[1:]:
            if g and g.lower() in names:
                out.add(names[g.lower()])
    return out


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
    """The numbers a text quotes; one followed by a time unit carries TIMED after it."""
    return [m.group(0) + (TIMED if TIME_UNIT.match(text, m.end()) else "") for m in NUM.finditer(text)
            if not NAMING.search(text[:m.start()])]


def _paragraphs(markdown: str) -> list[str]:
    """The paragraphs of a markdown text, its generated blocks taken out first (they span blank lines)."""
    return [p for p in re.split(r"\n\s*\n", GENERATED.sub(" ", markdown)) if p.strip()]


def _documents():
    """(name, the stages its paragraphs read when they name none, its paragraphs)."""
    for p in NOTEBOOKS:
        cells = [c.source for c in nbformat.read(str(p), as_version=4).cells if c.cell_type == "markdown"]
        yield p.stem, (p.stem,), [x for c in cells for x in _paragraphs(c)]
    for p in DOCS:
        yield p.name, DOC_STAGES.get(p.name, ()), _paragraphs(p.read_text())


def stale_numbers(name: str, defaults: tuple[str, ...], paragraphs: list[str]) -> list[tuple[str, str]]:
    """The (number, sentence) pairs of a document that no source its paragraph reads gives."""
    derived = DERIVED.get(name, {})
    out = []
    for para in paragraphs:
        sources = (set(defaults) | named_stages(para))
        for n, where in _quoted(para):
            timed, n = n.endswith(TIMED), n.rstrip(TIMED)
            values = _records(timed).union(*(_source(s) for s in sources))
            if n not in derived and not _rounds_to(values, n):
                out.append((n, where))
    return out


@pytest.mark.parametrize("name, defaults, paragraphs", list(_documents()),
                         ids=lambda x: x if isinstance(x, str) and len(x) < 40 else "")
def test_numbers_in_prose_come_from_the_output_they_name(name, defaults, paragraphs):
    stale = stale_numbers(name, defaults, paragraphs)
    assert not stale, f"{name}: {len(stale)} numbers that no output the paragraph names gives: {stale[:15]}"


def test_the_check_catches_a_stale_number():
    assert _rounds_to({0.8364, 0.5}, "0.836") and _rounds_to({0.8364}, "0.84") and _rounds_to({1141.0}, "1,141")
    assert not _rounds_to({0.8364, 0.5}, "0.849") and not _rounds_to({68.0}, "88")
    text = ("## Reading the results\n\nThe model scores 0.836 on 96 memes. The paper reports 0.807 on\nreal FHM.\n\n"
            "| | paper (FHM) | embedded |\n|---|---|---|\n| accuracy | 0.807 | 0.836 |\n"
            "Notebook 04 runs ViT-L/14 and `eval_n = 96` with SmolLM2-135M.\n")
    assert sorted(n for n, _ in _quoted(text)) == ["0.836", "0.836", "96"]


def test_a_number_from_another_stages_results_is_not_backed():
    """A number only notebook 05 prints fails in a paragraph of notebook 04 that does not name 05, and passes once
    the paragraph names it."""
    only_05 = sorted(_source("05_debate") - _source("04_few_shot") - _records())
    v = next(x for x in only_05 if 0 < x < 1 and round(x, 3) == x and not _rounds_to(
        _source("04_few_shot") | _records(), f"{x:.3f}"))
    text = f"The moderator scores {v:.3f} on these memes."
    assert stale_numbers("04_few_shot", ("04_few_shot",), [text]) == [(f"{v:.3f}", text)]
    assert stale_numbers("04_few_shot", ("04_few_shot",), [text + " Notebook 05 prints it."]) == []
    assert named_stages("notebooks 02-04 and 06_evaluation") == {"02_finetuning", "03_clip4dm", "04_few_shot",
                                                                  "06_evaluation"}


def test_a_records_time_backs_a_number_only_where_the_prose_writes_its_unit():
    """A record's seconds read as minutes or hours back "12.5 min" but not a bare 12.5: small numbers elsewhere in
    prose matched a time that happened to round to them."""
    plain = _records(False) | _source("04_few_shot")
    v = next(x for x in sorted(_records(True) - _records(False))
             if 1 < x < 100 and not _rounds_to(plain, f"{x:.1f}"))
    assert stale_numbers("04_few_shot", ("04_few_shot",), [f"It took {v:.1f} min on this machine."]) == []
    assert [n for n, _ in stale_numbers("04_few_shot", ("04_few_shot",), [f"It read {v:.1f} of them."])] == [f"{v:.1f}"]
