"""Vision-language encoders behind one protocol, selected by preset name.

Every backend offers the same operations, so TRACE, CLIP4DM and exemplar retrieval never
branch on the model family:

- `preprocess(images)` -> the model's image inputs (a dict of tensors);
- `tokenize(texts)` -> input_ids / attention_mask;
- `image_features(inputs)`, `text_features(tokens)`: pooled outputs before projection
  (TRACE's inputs), and `encode_images` / `encode_texts`: projected, optionally
  L2-normalised embeddings;
- `logit_scale` (and `logit_bias` for SigLIP), `similarity(images, texts)` equal to the raw
  model's `logits_per_image`;
- `text_layers()`: the text encoder's transformer layers (partial unfreezing, caching);
- `text_forward_with_attentions(tokens)`: projected text embeddings, the post-softmax
  attention maps of every text layer (in the autograd graph), and the pooled position of
  each sequence (CLIP4DM's gradient x attention). Backends whose attention cannot be
  reached raise `AttentionUnavailable` saying so. `text_forward_attributed(tokens, n)`: the
  same for the last `n` layers only, computed for attribution at the pooled position (the
  Hugging Face CLIP backend skips gradients below those layers and runs the last one at its
  pooled query alone; other backends return the full forward's maps).

Backends, one file each, registered by name (`registry.BACKENDS`: a preset's `backend:` ->
"module:Class", extended by `register_encoder`): `hf_clip` (Hugging Face CLIPModel), `hf_siglip`
(SigLIP and SigLIP2), `hf_blip` (BlipModel), `open_clip` (including CLIP-XLM-RoBERTa and
CLIP-RoBERTa). Files: `base` (the protocol) <- `hf` (Hugging Face loading) <- one file per
backend; `registry` (`load_encoder`) imports a backend only when a preset names it; `loading` reads image
files into any encoder's inputs batch by batch, on threads ahead of the model on a GPU.
"""
from __future__ import annotations

from lib.compendium.presets import lazy_exports
from lib.models.encoders.registry import BACKENDS, encoder_class, encoder_identity, load_encoder, register_encoder

#: Classes load with their module on first use (every backend imports torch; open_clip its own package).
_LAZY = {"Encoder": "lib.models.encoders.base", "AttentionUnavailable": "lib.models.encoders.base",
         "HFEncoder": "lib.models.encoders.hf", "HFClipEncoder": "lib.models.encoders.hf_clip",
         "HFSiglipEncoder": "lib.models.encoders.hf_siglip", "HFBlipEncoder": "lib.models.encoders.hf_blip",
         "OpenClipEncoder": "lib.models.encoders.openclip"}

__getattr__ = lazy_exports("lib.models.encoders", _LAZY)
