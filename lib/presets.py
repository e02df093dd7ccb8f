"""Model presets: named, versioned model references kept as data in `params/presets/`.

A preset says which backend loads a model and from where (a hub id or a local folder),
at which revision and in which dtype. The embedded and paper profiles differ only in the
preset names they give; the code path that loads and runs the model is the same.

`{artifacts}` in a preset's `model` is replaced by the repository's `artifacts/` folder, so
the models the compendium trains itself resolve like any local checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lib import ROOT

PRESETS_DIR = ROOT / "params" / "presets"


class PresetError(KeyError):
    """An unknown preset, or a preset file with a bad entry."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


@dataclass(frozen=True)
class Preset:
    name: str
    backend: str
    model: str                       # hub id, local folder, or an open_clip architecture name
    revision: str | None = None      # hub revision (branch, tag or commit); pin a commit for papers
    dtype: str = "float32"           # float32 | bfloat16 | float16
    options: dict[str, Any] = field(default_factory=dict)  # backend-specific (pretrained tag, base_url, prices...)
    notes: str = ""

    @property
    def resolved_model(self) -> str:
        return self.model.replace("{artifacts}", str(ROOT / "artifacts"))

    @property
    def is_local(self) -> bool:
        return Path(self.resolved_model).exists()

    def identity(self) -> dict[str, Any]:
        """What names this model for caching: id and revision (local folders by their weights' digest)."""
        ident: dict[str, Any] = {"model": self.model, "revision": self.revision, "backend": self.backend}
        p = Path(self.resolved_model)
        if p.is_dir():
            from lib.artifacts import file_digest
            weights = sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin"))
            ident["weights"] = [file_digest(w)[:16] for w in weights]
        return ident


def _read(kind: str) -> dict[str, Preset]:
    path = PRESETS_DIR / f"{kind}.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    out: dict[str, Preset] = {}
    known = {"backend", "model", "revision", "dtype", "notes"}
    for name, entry in data.items():
        if not isinstance(entry, dict) or "backend" not in entry or "model" not in entry:
            raise PresetError(f"params/presets/{kind}.yaml: preset '{name}' needs at least 'backend' and 'model'")
        opts = {k: v for k, v in entry.items() if k not in known}
        out[name] = Preset(name=name, backend=entry["backend"], model=str(entry["model"]),
                           revision=entry.get("revision"), dtype=entry.get("dtype", "float32"),
                           options=opts, notes=entry.get("notes", ""))
    return out


def presets(kind: str) -> dict[str, Preset]:
    """All presets of one kind: 'encoders' or 'chat'."""
    return _read(kind)


def get_preset(kind: str, name: str) -> Preset:
    table = _read(kind)
    if name not in table:
        raise PresetError(f"unknown {kind} preset '{name}' (params/presets/{kind}.yaml has: "
                          f"{', '.join(sorted(table))})")
    return table[name]


def torch_dtype(name: str):
    import torch
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise PresetError(f"dtype '{name}' is not one of float32, bfloat16, float16") from None
