"""The encoder protocol: what every vision-language encoder backend offers (see lib.models.encoders)."""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.compendium.presets import Preset


class AttentionUnavailable(NotImplementedError):
    """The backend does not expose differentiable text attention maps."""


class _StopForward(Exception):
    """Raised by a hook to end a forward pass once the wanted hidden states are captured."""


_HIDDEN_KEYS = ("hidden_states", "q_x", "x", "hidden")


def _hidden_arg(args, kwargs):
    if args:
        return args[0]
    for k in _HIDDEN_KEYS:
        if k in kwargs:
            return kwargs[k]
    raise RuntimeError(f"text layer called without a recognisable hidden-states argument: {sorted(kwargs)}")


class Encoder:
    """Shared logic; subclasses implement the family-specific parts."""
    backend = "base"
    supports_attention = False

    def __init__(self, model, tokenizer, processor, preset: Preset | None = None, device: str = "cpu"):
        self.model = model
        self.tokenizer = tokenizer
        self.processor = processor
        self.preset = preset
        self.device = device

    # -- inputs
    def tokenize(self, texts: Sequence[str], **kw) -> dict[str, Any]:
        """Token ids and mask; extra keywords go to the tokenizer (e.g. return_offsets_mapping)."""
        raise NotImplementedError

    def tokenize_with_offsets(self, texts: Sequence[str]) -> tuple[dict[str, Any], Any]:
        """`tokenize(texts)` and each token's character span [B, T, 2] (empty for special tokens
        and padding), as the tokenizer's `return_offsets_mapping` gives them."""
        enc = self.tokenize(texts, return_offsets_mapping=True)
        offsets = enc.pop("offset_mapping")
        return enc, offsets

    def preprocess(self, images) -> dict[str, Any]:
        raise NotImplementedError

    def _to_device(self, d: dict[str, Any]) -> dict[str, Any]:
        dtype = next(self.model.parameters()).dtype
        out = {}
        for k, v in d.items():
            if isinstance(v, torch.Tensor):              # from pinned memory the copy does not block the host
                v = v.to(self.device, non_blocking=v.is_pinned())
                if v.is_floating_point():
                    v = v.to(dtype)
            out[k] = v
        return out

    def _image_inputs(self, images) -> dict[str, Any]:
        if isinstance(images, torch.Tensor):
            return self._to_device({"pixel_values": images})
        if isinstance(images, dict) or hasattr(images, "keys"):
            return self._to_device(dict(images))
        return self._to_device(self.preprocess(images))

    def _text_inputs(self, texts) -> dict[str, Any]:
        if isinstance(texts, dict) or hasattr(texts, "keys"):
            return self._to_device(dict(texts))
        return self._to_device(self.tokenize(list(texts)))

    # -- features
    def image_features(self, images):
        """Pooled vision output before the projection."""
        raise NotImplementedError

    def text_features(self, texts):
        """Pooled text output before the projection."""
        raise NotImplementedError

    def project_image(self, feats):
        raise NotImplementedError

    def project_text(self, feats):
        raise NotImplementedError

    def encode_images(self, images, normalize: bool = True):
        e = self.project_image(self.image_features(images))
        return F.normalize(e, dim=-1) if normalize else e

    def encode_texts(self, texts, normalize: bool = True):
        e = self.project_text(self.text_features(texts))
        return F.normalize(e, dim=-1) if normalize else e

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.exp())

    @property
    def logit_bias(self) -> float | None:
        return None

    def similarity(self, images, texts):
        """logits [n_images, n_texts] = scale * cosine (+ bias), as the raw model computes them."""
        img, txt = self.encode_images(images), self.encode_texts(texts)
        logits = self.logit_scale * img @ txt.T
        return logits + self.logit_bias if self.logit_bias is not None else logits

    # -- internals for attribution and fine-tuning
    def text_layers(self):
        """The text encoder's transformer layers (Hugging Face CLIP/SigLIP layout by default)."""
        return self.model.text_model.encoder.layers

    # -- frozen-prefix caching (TRACE). The generic path works on any backend whose text tower runs
    # `text_layers()` in order: a pre-hook captures the hidden states entering layer `layer`, and the
    # resumed pass swaps the layers below for pass-throughs and feeds the cached states to `layer`,
    # so everything after it (final norms, poolers, heads) is the backend's own code.
    def text_hidden_below(self, tokens, layer: int):
        """Hidden states entering text layer `layer` (0-based), as the tower's own loop passes them."""
        layers = self.text_layers()
        if not 0 <= layer < len(layers):
            raise ValueError(f"{type(self).__name__}: layer {layer} outside 0..{len(layers) - 1}")
        box: dict[str, Any] = {}

        def grab(module, args, kwargs):
            box["h"] = _hidden_arg(args, kwargs)
            raise _StopForward

        handle = layers[layer].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            self.text_features(tokens)
        except _StopForward:
            pass
        finally:
            handle.remove()
        if "h" not in box:
            raise RuntimeError(f"{type(self).__name__}: text layer {layer} was never called")
        return box["h"]

    def text_features_from(self, hidden, tokens, layer: int):
        """Pooled text output (before projection) from hidden states entering layer `layer`; equal to
        `text_features(tokens)` when `hidden = text_hidden_below(tokens, layer)`. Only the layers from
        `layer` on run, so gradients reach exactly the unfrozen ones."""
        layers = self.text_layers()
        fmt = self._layer_output_format() if layer > 0 else None

        class _PassThrough(nn.Module):
            """Stands in for a cached layer: returns its input; attribute lookups reach the layer."""
            def __init__(self, orig):
                super().__init__()
                object.__setattr__(self, "_orig", orig)

            def __getattr__(self, name):
                try:
                    return super().__getattr__(name)
                except AttributeError:
                    return getattr(self.__dict__["_orig"], name)

            def forward(self, *args, **kwargs):
                h = _hidden_arg(args, kwargs)
                return h if fmt is None else (h,) + (None,) * (fmt - 1)

        def feed(module, args, kwargs):
            if args:
                return (hidden,) + tuple(args[1:]), kwargs
            key = next(k for k in _HIDDEN_KEYS if k in kwargs)
            return args, {**kwargs, key: hidden}

        saved = [layers[i] for i in range(layer)]
        for i in range(layer):
            layers[i] = _PassThrough(saved[i])
        handle = layers[layer].register_forward_pre_hook(feed, with_kwargs=True)
        try:
            return self.text_features(tokens)
        finally:
            handle.remove()
            for i, m in enumerate(saved):
                layers[i] = m

    def _layer_output_format(self):
        """None when a text layer returns a tensor, else the length of the tuple it returns."""
        if not hasattr(self, "_layer_fmt"):
            box: dict[str, Any] = {}

            def look(module, args, out):
                box["fmt"] = len(out) if isinstance(out, tuple) else None

            handle = self.text_layers()[0].register_forward_hook(look)
            try:
                with torch.no_grad():
                    self.text_features(["a"])
            finally:
                handle.remove()
            self._layer_fmt = box["fmt"]
        return self._layer_fmt

    def text_forward_with_attentions(self, tokens):
        raise AttentionUnavailable(f"{type(self).__name__}: text attention maps are not reachable for this backend")

    def text_forward_attributed(self, tokens, n_layers: int):
        """Projected text embeddings, the attention maps of the last `n_layers` text layers and the
        pooled positions (see HFClipEncoder's faster version): here the full forward's maps."""
        emb, atts, pool = self.text_forward_with_attentions(tokens)
        if not 1 <= n_layers <= len(atts):
            raise ValueError(f"n_layers={n_layers}, but the text encoder has {len(atts)} layers")
        return emb, tuple(atts[-n_layers:]), pool

    @property
    def text_dim(self) -> int:
        return self.model.config.text_config.hidden_size

    @property
    def image_dim(self) -> int:
        return self.model.config.vision_config.hidden_size

    def __repr__(self) -> str:
        name = self.preset.name if self.preset else "(unnamed)"
        return f"<{type(self).__name__} {name} on {self.device}>"


def require_eager(model, who: str) -> None:
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    text_impl = getattr(getattr(model.config, "text_config", None), "_attn_implementation", None)
    if (text_impl or impl) != "eager":
        raise AttentionUnavailable(
            f"{who}: attention maps need eager attention, the model runs '{text_impl or impl}'; "
            f"load it with attn_implementation='eager' (the presets do)")
