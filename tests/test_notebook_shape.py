"""How the notebooks read: short code cells (the logic lives in lib), and notebook 06 rebuilding
earlier stages only from what they declared, never from their profile sections."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from lib.arcade import report as debate_report
from lib.sei import report as sei_report
from lib.compendium.artifacts import ARTIFACTS

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_LINES = 20


def code_cells(path: Path):
    return [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


def parameter_names(path: Path) -> set[str]:
    cell = next(c for c in code_cells(path) if "parameters" in c.metadata.get("tags", []))
    return {t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Name)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_cells_are_short(path):
    # the parameters cell lists one parameter per line and papermill writes the injected one: both exempt
    long = [(k, len(c.source.splitlines())) for k, c in enumerate(code_cells(path))
            if not {"parameters", "injected-parameters"} & set(c.metadata.get("tags", []))
            and len(c.source.splitlines()) > MAX_LINES]
    assert not long, f"{path.name}: code cells over {MAX_LINES} lines (cell, lines): {long}"


def test_evaluation_reads_only_declared_artifacts():
    src = "\n".join(c.source for c in code_cells(next(p for p in NOTEBOOKS if p.stem == "06_evaluation")))
    assert "load_profile" not in src and "P[" not in src
    # caption columns come from the runs, never MemeWorld's names (the real TRACE JSON has others)
    assert "vlm_caption" not in src and "tag_caption" not in src
    # its own folder is the only stage folder it names; everything else comes through require()
    assert set(re.findall(r"stage_dir\(profile, ([^)]+)\)", src)) == {"STAGE"}
    for name in re.findall(r'require\(profile, "([^"]+)"', src) + ["sei_settings", "debate_settings"]:
        assert name in ARTIFACTS, name


@pytest.mark.parametrize("stem, keys", [("04_few_shot", sei_report.SETTINGS_KEYS),
                                        ("05_debate", debate_report.SETTINGS_KEYS)])
def test_settings_files_hold_parameters_of_their_notebook(stem, keys):
    # notebook 04 / 05 write settings.json from these names; each must be one of its parameters
    missing = set(keys) - parameter_names(next(p for p in NOTEBOOKS if p.stem == stem))
    assert not missing, f"{stem}: SETTINGS_KEYS not among its parameters: {sorted(missing)}"
