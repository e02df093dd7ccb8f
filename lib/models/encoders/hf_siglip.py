"""Encoder backend `hf_siglip`: SigLIP and SigLIP2 (sigmoid loss: a logit bias beside the scale)."""
from __future__ import annotations

import torch

from lib.models.encoders.base import require_eager
from lib.models.encoders.hf import HFEncoder
from lib.models.encoders.registry import register_encoder


@register_encoder("hf_siglip")
class HFSiglipEncoder(HFEncoder):
    """SigLIP and SigLIP2: sigmoid-trained, texts padded to the fixed length they were trained with."""
    backend = "hf_siglip"
    supports_attention = True

    @property
    def _max_len(self) -> int:
        return int(getattr(self.model.config.text_config, "max_position_embeddings", 64))

    def tokenize(self, texts, **kw):
        return self.tokenizer(list(texts), padding="max_length", truncation=True, max_length=self._max_len,
                              return_tensors="pt", **kw)

    def preprocess(self, images):
        return self.processor(images=images, return_tensors="pt")

    def _vision_kwargs(self, inp):
        return {k: inp[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes") if k in inp}

    def image_features(self, images):
        inp = self._image_inputs(images)
        return self.model.vision_model(**self._vision_kwargs(inp)).pooler_output

    def text_features(self, texts):
        inp = self._text_inputs(texts)
        kw = {"attention_mask": inp["attention_mask"]} if "attention_mask" in inp else {}
        return self.model.text_model(input_ids=inp["input_ids"], **kw).pooler_output

    # SigLIP's heads (attention pooling, text head) sit inside the towers: no separate projection
    def project_image(self, feats):
        return feats

    def project_text(self, feats):
        return feats

    @property
    def logit_bias(self):
        return float(self.model.logit_bias.reshape(-1)[0])

    def text_forward_with_attentions(self, tokens):
        require_eager(self.model, "hf_siglip")
        inp = self._text_inputs(tokens)
        kw = {"attention_mask": inp["attention_mask"]} if "attention_mask" in inp else {}
        out = self.model.text_model(input_ids=inp["input_ids"], output_attentions=True, **kw)
        n = inp["input_ids"].shape[0]
        # SigLIP pools the last position (its text head reads the final token)
        last = torch.full((n,), inp["input_ids"].shape[1] - 1, dtype=torch.long, device=inp["input_ids"].device)
        return out.pooler_output, tuple(out.attentions), last
