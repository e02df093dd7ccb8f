"""Shared library of the compendium: data, backends, methods and the stage harness.

Modules are flat and each holds one concern; notebooks call into them. Heavy
dependencies (torch, transformers, open_clip) are imported lazily by the modules
that need them, so that `import lib` stays cheap.
"""

__all__ = ["ROOT"]

from pathlib import Path

#: Repository root (the folder holding Makefile, params/, notebooks/).
ROOT = Path(__file__).resolve().parent.parent

# CPU numerics pinned to one code path before torch, MKL or OpenBLAS load, so that CPU-trained models have
# the same bits on machines of one kind (lib/compendium/numerics.py says why, what differs across kinds, and
# how to opt out).
from lib.compendium import numerics as _numerics  # noqa: E402

_numerics.apply()

# what a stage's processes import and open, recorded for its stamp when `make reproduce` asks (COMPENDIUM_USAGE_DIR)
from lib.compendium import usage as _usage  # noqa: E402

_usage.install(ROOT)
