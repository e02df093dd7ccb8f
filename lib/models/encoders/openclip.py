"""Encoder backend `open_clip`: open_clip towers (CLIP, CLIP-XLM-RoBERTa, CLIP-RoBERTa)."""
from __future__ import annotations

import open_clip
import torch
import torch.nn as nn

from lib.models.encoders.base import AttentionUnavailable, Encoder
from lib.models.encoders.registry import register_encoder
from lib.compendium.presets import Preset


@register_encoder("open_clip")
class OpenClipEncoder(Encoder):
    """open_clip models (native text towers, or Hugging Face text towers such as XLM-RoBERTa)."""
    backend = "open_clip"

    @classmethod
    def from_preset(cls, preset: Preset, device: str) -> "OpenClipEncoder":
        precision = {"float32": "fp32", "bfloat16": "bf16"}.get(preset.dtype, "fp16")
        name = preset.resolved_model             # an architecture name, hf-hub:..., or local-dir:{artifacts}/...
        model, _, preprocess = open_clip.create_model_and_transforms(
            name, pretrained=preset.options.get("pretrained"), precision=precision, device=device)
        return cls(model.eval(), open_clip.get_tokenizer(name), preprocess, preset, device)

    def tokenize(self, texts, **kw):
        ids = self.tokenizer(list(texts))
        return {"input_ids": ids}

    def preprocess(self, images):
        if not isinstance(images, (list, tuple)):
            images = [images]
        return {"pixel_values": torch.stack([self.processor(im.convert("RGB")) for im in images])}

    def image_features(self, images):
        inp = self._image_inputs(images)
        visual = self.model.visual
        proj = getattr(visual, "proj", None)
        if proj is None:
            return visual(inp["pixel_values"])
        visual.proj = None
        try:
            return visual(inp["pixel_values"])
        finally:
            visual.proj = proj

    def project_image(self, feats):
        proj = getattr(self.model.visual, "proj", None)
        return feats if proj is None else feats @ proj

    def text_features(self, texts):
        inp = self._text_inputs(texts)
        ids = inp["input_ids"]
        if hasattr(self.model, "text") and hasattr(self.model.text, "transformer"):  # HF text tower
            text = self.model.text
            proj = text.proj
            text.proj = nn.Identity()
            try:
                return text(ids)
            finally:
                text.proj = proj
        # native tower: encode_text without the final text_projection
        m = self.model
        proj = m.text_projection
        m.text_projection = None
        try:
            return m.encode_text(ids)
        finally:
            m.text_projection = proj

    def project_text(self, feats):
        if hasattr(self.model, "text") and hasattr(self.model.text, "transformer"):
            return self.model.text.proj(feats)
        proj = self.model.text_projection
        if proj is None:
            return feats
        return proj(feats) if isinstance(proj, nn.Module) else feats @ proj

    @property
    def logit_bias(self):
        b = getattr(self.model, "logit_bias", None)
        return None if b is None else float(b.reshape(-1)[0])

    def text_layers(self):
        if hasattr(self.model, "text") and hasattr(self.model.text, "transformer"):
            return self.model.text.transformer.encoder.layer
        return self.model.transformer.resblocks

    @property
    def text_dim(self):
        if hasattr(self.model, "text") and hasattr(self.model.text, "transformer"):
            return self.model.text.config.hidden_size
        return self.model.transformer.width

    @property
    def image_dim(self):
        v = self.model.visual
        return getattr(v, "width", None) or v.transformer.width

    def text_forward_with_attentions(self, tokens):
        raise AttentionUnavailable(
            "open_clip: its text towers call nn.MultiheadAttention without returning weights, so the "
            "attention maps CLIP4DM differentiates are not reachable; use a Hugging Face CLIP or SigLIP preset")
