"""Encoder backend `hf_blip`: BLIP's image-text retrieval model (its ITC heads)."""
from __future__ import annotations

from lib.models.encoders.hf import HFEncoder
from lib.models.encoders.registry import register_encoder


@register_encoder("hf_blip")
class HFBlipEncoder(HFEncoder):
    """BLIP's contrastive (ITC) heads of `BlipForImageTextRetrieval`, the class of the blip-itm
    checkpoints: CLS features through vision_proj / text_proj, similarity = cosine (no scale).
    The paper uses its image embeddings for exemplar retrieval."""
    backend = "hf_blip"
    model_class = "BlipForImageTextRetrieval"

    def tokenize(self, texts, **kw):
        return self.tokenizer(list(texts), padding=True, truncation=True, max_length=35, return_tensors="pt", **kw)

    def preprocess(self, images):
        return self.processor(images=images, return_tensors="pt")

    def image_features(self, images):
        inp = self._image_inputs(images)
        return self.model.vision_model(pixel_values=inp["pixel_values"]).last_hidden_state[:, 0, :]

    def text_features(self, texts):
        inp = self._text_inputs(texts)
        out = self.model.text_encoder(input_ids=inp["input_ids"], attention_mask=inp.get("attention_mask"))
        return out.last_hidden_state[:, 0, :]

    def project_image(self, feats):
        return self.model.vision_proj(feats)

    def project_text(self, feats):
        return self.model.text_proj(feats)

    @property
    def logit_scale(self) -> float:
        return 1.0

    def text_layers(self):
        return self.model.text_encoder.encoder.layer
