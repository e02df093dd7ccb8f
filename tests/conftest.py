import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest


@pytest.fixture(scope="session")
def memeworld_small(tmp_path_factory):
    """A small MemeWorld (all views, real formats) shared by the data tests."""
    from lib.memeworld import write_memeworld
    out = tmp_path_factory.mktemp("memeworld")
    sheet = write_memeworld(out, n=600, seed=3, n_multioff=120, workers=1, progress=False)
    return out, sheet
