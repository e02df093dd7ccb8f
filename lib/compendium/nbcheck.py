"""The recorded outputs nbval compares the notebooks' checked cells with, at ci sizes.

`make test` runs every notebook once under the ci profile with nbval as the executor (lib.compendium.execution:
papermill injects the parameters, nbval runs each cell as a test and compares the cells a notebook marks with
nbval's own `# NBVAL_CHECK_OUTPUT`). What those cells print holds at ci sizes on any machine (counts, shapes,
the schema of each stage's outputs, MemeWorld's Bayes readers); their recorded outputs live in
tests/reference/ci_checked_outputs.json, each with the digest of the cell's source, so an edited cell is never
compared with what another version of it printed.

    python -m lib.compendium.nbcheck            # which checked cells have no recorded output for their current source
    python -m lib.compendium.nbcheck --write    # record the ci run's checked outputs (artifacts/ci/notebooks/)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lib import ROOT
from lib.compendium.artifacts import ARTIFACTS_ROOT, write_json
from lib.compendium.execution import REFERENCE, cell_digest, checked_cells, read_reference
from lib.compendium.params import NOTEBOOKS_DIR

#: output fields nbval never compares (and that change from run to run)
VOLATILE = ("execution_count", "metadata", "transient")


def recorded_outputs(executed: Path) -> list[dict[str, Any]]:
    """The checked cells of an executed notebook, in order: {"source": digest, "outputs": [...]}, the outputs
    without the fields nbval does not compare."""
    import nbformat
    nb = nbformat.read(str(executed), as_version=4)
    out = []
    for i in checked_cells(nb):
        cell = nb.cells[i]
        outs = [{k: v for k, v in dict(o).items() if k not in VOLATILE} for o in cell.get("outputs", [])]
        out.append({"source": cell_digest(cell.source), "outputs": json.loads(json.dumps(outs))})
    return out


def unrecorded(reference: dict[str, list[dict[str, Any]]] | None = None) -> list[str]:
    """Every checked cell of the committed notebooks without a recorded output for its current source."""
    import nbformat
    ref = read_reference() if reference is None else reference
    missing = []
    for nb_file in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(nb_file), as_version=4)
        recs = ref.get(nb_file.name, [])
        for k, i in enumerate(checked_cells(nb)):
            if k >= len(recs) or recs[k].get("source") != cell_digest(nb.cells[i].source):
                missing.append(f"notebooks/{nb_file.name} cell {i}")
        if len(recs) > len(checked_cells(nb)):
            missing.append(f"notebooks/{nb_file.name}: {len(recs) - len(checked_cells(nb))} recorded output(s) "
                           f"for cells no longer checked")
    return missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="record the ci run's checked outputs as the reference")
    ap.add_argument("--profile", default="ci")
    a = ap.parse_args(argv)
    if a.write:
        nbs = sorted((ARTIFACTS_ROOT / a.profile / "notebooks").glob("[0-9][0-9]_*.ipynb"))
        if not nbs:
            print(f"error: no executed notebook under artifacts/{a.profile}/notebooks/: run "
                  f"`make reproduce PROFILE={a.profile}` first")
            return 2
        got = {p.name: recs for p in nbs if (recs := recorded_outputs(p))}
        write_json(REFERENCE, got)
        print(f"{REFERENCE.relative_to(ROOT)}: {sum(len(v) for v in got.values())} checked cells of {len(got)} notebooks")
        return 0
    missing = unrecorded()
    print(json.dumps({"unrecorded": missing}, indent=1))
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
