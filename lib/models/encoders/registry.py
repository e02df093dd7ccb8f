"""Encoder registry and loading: preset backend name -> "module:Class", `load_encoder`."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from lib.compendium.artifacts import code_of
from lib.compendium.presets import (Preset, PresetError, default_device, folder_identity, get_preset, registered_class,
                                    registrar)

if TYPE_CHECKING:          # the protocol imports torch; the registry itself does not
    from lib.models.encoders.base import Encoder

#: Preset `backend:` name -> "module:Class", imported when a preset names it (open_clip loads only
#: for open_clip presets). Add one with `register_encoder` or an entry here.
BACKENDS: dict[str, str] = {
    "hf_clip": "lib.models.encoders.hf_clip:HFClipEncoder",
    "hf_siglip": "lib.models.encoders.hf_siglip:HFSiglipEncoder",
    "hf_blip": "lib.models.encoders.hf_blip:HFBlipEncoder",
    "open_clip": "lib.models.encoders.openclip:OpenClipEncoder",
}


#: Class decorator: an encoder backend presets name as `backend: <name>`; the class is an
#: `lib.models.encoders.base.Encoder` with a `from_preset(preset, device)` classmethod.
register_encoder = registrar(BACKENDS)


def encoder_class(name: str, preset_name: str = "?") -> type:
    return registered_class(BACKENDS, name, f"encoder preset '{preset_name}'")


def _detect_backend(path: Path) -> str:
    cfg = json.loads((path / "config.json").read_text())
    mt = cfg.get("model_type", "")
    if mt == "clip":
        return "hf_clip"
    if mt in ("siglip", "siglip2"):
        return "hf_siglip"
    if mt == "blip":
        return "hf_blip"
    raise PresetError(f"{path}/config.json: model_type '{mt}' is not a supported encoder (clip, siglip, siglip2, blip)")


def encoder_identity(name_or_path: str | Path) -> dict:
    """What an encoder's embeddings depend on, for the caches that read them back (probe features, retrieval
    embeddings, CLIP4DM attributions): the preset's identity (a local folder's weights) and the definitions of
    the backend's code (its module and the protocol it builds on)."""
    p = Path(str(name_or_path))
    if p.is_dir() and (p / "config.json").exists():
        backend, ident = _detect_backend(p), folder_identity(p)
    else:
        preset = get_preset("encoders", str(name_or_path))
        backend, ident = preset.backend, preset.identity()
    module = BACKENDS.get(backend, "").split(":")[0]
    code = code_of(*(m for m in ("lib.models.encoders.base", "lib.models.encoders.hf", module) if m))
    return {"model": ident, "backend": backend, "code": code}


def load_encoder(name_or_path: str | Path, device: str | None = None, **overrides) -> "Encoder":
    """An encoder from a preset name (params/presets/encoders.yaml) or a local Hugging Face folder."""
    p = Path(str(name_or_path))
    if p.is_dir() and (p / "config.json").exists():
        preset = Preset(name=p.name, backend=_detect_backend(p), model=str(p),
                        options={"attn_implementation": "eager"})
    else:
        preset = get_preset("encoders", str(name_or_path))
    if overrides:
        preset = replace(preset, **{k: v for k, v in overrides.items() if k in ("dtype", "revision")},
                         options={**preset.options, **{k: v for k, v in overrides.items()
                                                       if k not in ("dtype", "revision")}})
    device = device or default_device()
    return encoder_class(preset.backend, preset.name).from_preset(preset, device)
