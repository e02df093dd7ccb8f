"""Output checks of the notebooks run at ci sizes: nbval's NBVAL_CHECK_OUTPUT, without a second run.

`make test` executes every notebook once under the ci profile (papermill: each cell runs, each
assertion in a notebook is checked). A cell whose source starts with `# NBVAL_CHECK_OUTPUT` prints
something that holds at those sizes on any machine (data counts, the Bayes readers of MemeWorld,
benchmark sizes); its text outputs are compared with tests/reference/ci_checked_outputs.json.

    python -m lib.compendium.nbcheck --write      # record the ci run's checked outputs as the new reference
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import nbformat

from lib import ROOT
from lib.compendium.artifacts import ARTIFACTS_ROOT, read_json, write_json

MARK = "NBVAL_CHECK_OUTPUT"
REFERENCE = ROOT / "tests" / "reference" / "ci_checked_outputs.json"


def checked_outputs(path: Path) -> list[str]:
    """The text each checked cell printed (stdout and text/plain results, in order), one string per cell."""
    out = []
    for c in nbformat.read(str(path), as_version=4).cells:
        if c.cell_type != "code" or not c.source.lstrip().startswith(f"# {MARK}"):
            continue
        texts = []
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stdout":
                texts.append(o.get("text", ""))
            elif "data" in o and "text/plain" in o["data"]:
                texts.append(o["data"]["text/plain"])
        out.append("".join(texts))
    return out


def read_reference() -> dict[str, list[str]]:
    return read_json(REFERENCE) if REFERENCE.exists() else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="record the ci run's checked outputs as the reference")
    ap.add_argument("--profile", default="ci")
    a = ap.parse_args(argv)
    nbs = sorted((ARTIFACTS_ROOT / a.profile / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    got = {p.name: checked_outputs(p) for p in nbs if checked_outputs(p)}
    if a.write:
        write_json(REFERENCE, got)
        print(f"{REFERENCE.relative_to(ROOT)}: {sum(len(v) for v in got.values())} checked cells of {len(got)} notebooks")
        return 0
    ref = read_reference()
    bad = [nb for nb in ref if got.get(nb) != ref[nb]]
    print(json.dumps({"checked_notebooks": len(ref), "differ": bad}))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
