"""Shared loading of the Hugging Face encoder backends (hf_clip, hf_siglip, hf_blip)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import transformers
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

from lib.compendium.artifacts import MissingInputError
from lib.models.encoders.base import Encoder
from lib.compendium.presets import Preset, PresetError, torch_dtype


def _hf_kwargs(preset: Preset) -> dict[str, Any]:
    kw: dict[str, Any] = {"dtype": torch_dtype(preset.dtype)}
    if preset.revision and not preset.is_local:
        kw["revision"] = preset.revision
    if preset.options.get("attn_implementation"):
        kw["attn_implementation"] = preset.options["attn_implementation"]
    return kw


class HFEncoder(Encoder):
    """A Hugging Face vision-language model with its tokenizer and image processor."""
    model_class = "AutoModel"        # the transformers class that loads the checkpoint

    @classmethod
    def from_preset(cls, preset: Preset, device: str) -> "HFEncoder":
        if preset.is_local is False and Path(preset.model).is_absolute():
            raise PresetError(f"encoder preset '{preset.name}': {preset.resolved_model} does not exist")
        local = preset.resolved_model
        if "{artifacts}" in preset.model and not Path(local).exists():
            raise MissingInputError(f"encoder preset '{preset.name}': {local} does not exist; "
                                    f"train it with `make reproduce NB=models`")
        kw = _hf_kwargs(preset)
        model = getattr(transformers, cls.model_class).from_pretrained(local, **kw)
        tok_kw = {"revision": kw["revision"]} if "revision" in kw else {}
        tokenizer = AutoTokenizer.from_pretrained(local, **tok_kw)
        try:
            processor = AutoProcessor.from_pretrained(local, **tok_kw)
            processor = getattr(processor, "image_processor", processor)
        except (OSError, ValueError, TypeError):
            processor = AutoImageProcessor.from_pretrained(local, **tok_kw)
        return cls(model.to(device).eval(), tokenizer, processor, preset, device)
