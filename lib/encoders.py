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

Backends: `hf_clip` (Hugging Face CLIPModel), `hf_siglip` (SigLIP and SigLIP2), `hf_blip`
(BlipModel), `open_clip` (including CLIP-XLM-RoBERTa and CLIP-RoBERTa).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from lib.presets import Preset, PresetError, get_preset, torch_dtype


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


def _pooled(out):
    """transformers 5 returns model outputs from get_*_features; older versions tensors."""
    return out.pooler_output if hasattr(out, "pooler_output") else out


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
        import torch
        dtype = next(self.model.parameters()).dtype
        out = {}
        for k, v in d.items():
            if isinstance(v, torch.Tensor):
                v = v.to(self.device)
                if v.is_floating_point():
                    v = v.to(dtype)
            out[k] = v
        return out

    def _image_inputs(self, images) -> dict[str, Any]:
        import torch
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
        import torch.nn.functional as F
        e = self.project_image(self.image_features(images))
        return F.normalize(e, dim=-1) if normalize else e

    def encode_texts(self, texts, normalize: bool = True):
        import torch.nn.functional as F
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
        import torch.nn as nn
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
            import torch
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


def _clip_layer_at(blk, h, pos, attention_mask, return_weights: bool = False):
    """One CLIP encoder layer evaluated only at position `pos[b]` of each sequence (causal attention
    over positions <= pos, padding masked): the layer's output rows [B, D] at those positions, and
    with `return_weights` also the attention row there, [B, H, 1, T]."""
    import torch
    B, T, D = h.shape
    a = blk.self_attn
    ar = torch.arange(B, device=h.device)
    x = blk.layer_norm1(h)
    q = a.q_proj(x[ar, pos]).view(B, a.num_heads, 1, a.head_dim)
    k = a.k_proj(x).view(B, T, a.num_heads, a.head_dim).transpose(1, 2)
    v = a.v_proj(x).view(B, T, a.num_heads, a.head_dim).transpose(1, 2)
    w = torch.matmul(q, k.transpose(-1, -2)) * a.scale                      # [B, H, 1, T]
    allowed = torch.arange(T, device=h.device)[None, :] <= pos[:, None]
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()
    w = w.masked_fill(~allowed[:, None, None, :], torch.finfo(w.dtype).min)
    w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    w = torch.nn.functional.dropout(w, p=a.dropout if a.training else 0.0, training=a.training)
    o = a.out_proj(torch.matmul(w, v).reshape(B, D))
    r = h[ar, pos] + o
    out = r + blk.mlp(blk.layer_norm2(r))
    return (out, w) if return_weights else out


def torch_arange(n, device):
    import torch
    return torch.arange(n, device=device)


def _require_eager(model, who: str) -> None:
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    text_impl = getattr(getattr(model.config, "text_config", None), "_attn_implementation", None)
    if (text_impl or impl) != "eager":
        raise AttentionUnavailable(
            f"{who}: attention maps need eager attention, the model runs '{text_impl or impl}'; "
            f"load it with attn_implementation='eager' (the presets do)")


class HFClipEncoder(Encoder):
    backend = "hf_clip"
    supports_attention = True
    trims_padding = True          # tokenize pads to the batch's longest text

    def tokenize(self, texts, **kw):
        return self.tokenizer(list(texts), padding=True, truncation=True,
                              max_length=self.model.config.text_config.max_position_embeddings,
                              return_tensors="pt", **kw)

    def tokenize_with_offsets(self, texts):
        """The same ids, mask and offsets as `tokenize(texts, return_offsets_mapping=True)`, read
        straight from the Rust tokenizer (a private copy with this method's truncation and
        padding): the Python wrapper costs about as much again as the encoding on short
        captions. Tested equal to the wrapper; other tokenizer types take the wrapper."""
        import numpy as np
        import torch
        bt = getattr(self, "_offsets_tokenizer", None)
        if bt is None:
            src = getattr(self.tokenizer, "backend_tokenizer", None)
            if (src is None or self.tokenizer.pad_token_id is None or self.tokenizer.padding_side != "right"
                    or getattr(self.tokenizer, "truncation_side", "right") != "right"):
                return super().tokenize_with_offsets(texts)
            import copy
            bt = copy.deepcopy(src)
            bt.enable_truncation(self.model.config.text_config.max_position_embeddings)
            bt.no_padding()
            self._offsets_tokenizer = bt
        es = bt.encode_batch(list(texts))
        n = max((len(e.ids) for e in es), default=0)
        ids = np.full((len(es), n), self.tokenizer.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(es), n), dtype=np.int64)
        offsets = np.zeros((len(es), n, 2), dtype=np.int64)
        for i, e in enumerate(es):
            k = len(e.ids)
            ids[i, :k], mask[i, :k], offsets[i, :k] = e.ids, 1, e.offsets
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}, torch.from_numpy(offsets)

    def preprocess(self, images):
        return self.processor(images=images, return_tensors="pt")

    def image_features(self, images):
        inp = self._image_inputs(images)
        return self.model.vision_model(pixel_values=inp["pixel_values"]).pooler_output

    def text_features(self, texts):
        inp = self._text_inputs(texts)
        return self.model.text_model(input_ids=inp["input_ids"], attention_mask=inp.get("attention_mask")).pooler_output

    def project_image(self, feats):
        return self.model.visual_projection(feats)

    def project_text(self, feats):
        return self.model.text_projection(feats)

    # -- frozen-prefix caching (TRACE): hidden states below the lowest unfrozen layer are computed once
    def _causal_mask(self, hidden, attention_mask):
        from transformers.masking_utils import create_causal_mask
        return create_causal_mask(config=self.model.text_model.config, inputs_embeds=hidden,
                                  attention_mask=attention_mask, past_key_values=None)

    def text_hidden_below(self, tokens, layer: int):
        """Hidden states entering text layer `layer` (0-based): embeddings + layers[:layer]."""
        inp = self._text_inputs(tokens)
        tm = self.model.text_model
        h = tm.embeddings(input_ids=inp["input_ids"])
        mask = self._causal_mask(h, inp.get("attention_mask"))
        for blk in tm.encoder.layers[:layer]:
            h = blk(h, mask)
        return h

    #: compute only the pooled position in the last text layer when resuming from a cache (exact)
    pooled_only = True

    def text_features_from(self, hidden, tokens, layer: int, pooled_only: bool | None = None):
        """Pooled text output (before projection) from hidden states entering layer `layer`;
        equal to `text_features(tokens)` when `hidden = text_hidden_below(tokens, layer)`.

        pooled_only: CLIP pools one position (EOT) after a per-token final LayerNorm, so the last
        layer's other positions are never used; computing only the pooled query there (keys and
        values still over all positions) gives the same output and gradients at a fraction of
        the cost."""
        pooled_only = self.pooled_only if pooled_only is None else pooled_only
        inp = self._text_inputs(tokens)
        tm = self.model.text_model
        layers = tm.encoder.layers
        last = len(layers) - 1 if pooled_only else len(layers)
        pool = self.pool_index(inp["input_ids"])
        ar = torch_arange(hidden.shape[0], hidden.device)
        h = hidden
        if layer < last:
            mask = self._causal_mask(hidden, inp.get("attention_mask"))
            for blk in layers[layer:last]:
                h = blk(h, mask)
        if pooled_only:
            h = _clip_layer_at(layers[-1], h, pool, inp.get("attention_mask"))
            return tm.final_layer_norm(h)
        h = tm.final_layer_norm(h)
        return h[ar, pool]

    def pool_index(self, input_ids):
        """The EOT position CLIP pools at (first eos; argmax id for legacy eos_token_id == 2)."""
        eos = self.model.text_model.eos_token_id if hasattr(self.model.text_model, "eos_token_id") \
            else self.model.config.text_config.eos_token_id
        if eos == 2:
            return input_ids.int().argmax(-1)
        return (input_ids == eos).int().argmax(-1)

    def text_forward_attributed(self, tokens, n_layers: int):
        """What attribution at the pooled (EOT) position needs, computed for it alone: the projected
        text embeddings, the attention maps of the last `n_layers` text layers (differentiable)
        and the pooled positions. Layers below those run without gradients; the last layer runs
        only at its pooled query (keys and values over all positions), because its other rows
        never reach the output and their gradients are zero, so its map comes back as the pooled
        row, [B, H, 1, T]. Values and gradients equal `text_forward_with_attentions` (tested)."""
        import torch
        _require_eager(self.model, "hf_clip")
        inp = self._text_inputs(tokens)
        tm = self.model.text_model
        layers = tm.encoder.layers
        n = len(layers)
        if not 1 <= n_layers <= n:
            raise ValueError(f"n_layers={n_layers}, but the text encoder has {n} layers")
        pool = self.pool_index(inp["input_ids"])
        with torch.no_grad():
            h = tm.embeddings(input_ids=inp["input_ids"])
            mask = self._causal_mask(h, inp.get("attention_mask"))
            for blk in layers[:n - n_layers]:
                h = blk(h, mask)
        h = h.detach().requires_grad_(True)        # a graph to the maps even if the weights are frozen
        maps = []
        for blk in layers[n - n_layers:n - 1]:
            a, w = blk.self_attn(hidden_states=blk.layer_norm1(h), attention_mask=mask)
            h = h + a
            h = h + blk.mlp(blk.layer_norm2(h))
            maps.append(w)
        h, w = _clip_layer_at(layers[-1], h, pool, inp.get("attention_mask"), return_weights=True)
        maps.append(w)
        emb = self.model.text_projection(tm.final_layer_norm(h))
        return emb, tuple(maps), pool

    def text_forward_with_attentions(self, tokens):
        _require_eager(self.model, "hf_clip")
        inp = self._text_inputs(tokens)
        out = self.model.text_model(input_ids=inp["input_ids"], attention_mask=inp.get("attention_mask"),
                                    output_attentions=True)
        emb = self.model.text_projection(out.pooler_output)
        return emb, tuple(out.attentions), self.pool_index(inp["input_ids"])


class HFSiglipEncoder(Encoder):
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
        import torch
        _require_eager(self.model, "hf_siglip")
        inp = self._text_inputs(tokens)
        kw = {"attention_mask": inp["attention_mask"]} if "attention_mask" in inp else {}
        out = self.model.text_model(input_ids=inp["input_ids"], output_attentions=True, **kw)
        n = inp["input_ids"].shape[0]
        # SigLIP pools the last position (its text head reads the final token)
        last = torch.full((n,), inp["input_ids"].shape[1] - 1, dtype=torch.long, device=inp["input_ids"].device)
        return out.pooler_output, tuple(out.attentions), last


class HFBlipEncoder(Encoder):
    """BLIP's contrastive (ITC) heads of `BlipForImageTextRetrieval`, the class of the blip-itm
    checkpoints: CLS features through vision_proj / text_proj, similarity = cosine (no scale).
    The paper uses its image embeddings for exemplar retrieval."""
    backend = "hf_blip"

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


class OpenClipEncoder(Encoder):
    """open_clip models (native text towers, or Hugging Face text towers such as XLM-RoBERTa)."""
    backend = "open_clip"

    def tokenize(self, texts, **kw):
        ids = self.tokenizer(list(texts))
        return {"input_ids": ids}

    def preprocess(self, images):
        import torch
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
            import torch.nn as nn
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
        import torch.nn as nn
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


BACKENDS = {"hf_clip": HFClipEncoder, "hf_siglip": HFSiglipEncoder, "hf_blip": HFBlipEncoder,
            "open_clip": OpenClipEncoder}


def _hf_kwargs(preset: Preset) -> dict[str, Any]:
    kw: dict[str, Any] = {"dtype": torch_dtype(preset.dtype)}
    if preset.revision and not preset.is_local:
        kw["revision"] = preset.revision
    if preset.options.get("attn_implementation"):
        kw["attn_implementation"] = preset.options["attn_implementation"]
    return kw


def _detect_backend(path: Path) -> str:
    import json
    cfg = json.loads((path / "config.json").read_text())
    mt = cfg.get("model_type", "")
    if mt == "clip":
        return "hf_clip"
    if mt in ("siglip", "siglip2"):
        return "hf_siglip"
    if mt == "blip":
        return "hf_blip"
    raise PresetError(f"{path}/config.json: model_type '{mt}' is not a supported encoder (clip, siglip, siglip2, blip)")


def load_encoder(name_or_path: str | Path, device: str | None = None, **overrides) -> Encoder:
    """An encoder from a preset name (params/presets/encoders.yaml) or a local Hugging Face folder."""
    import torch
    p = Path(str(name_or_path))
    if p.is_dir() and (p / "config.json").exists():
        preset = Preset(name=p.name, backend=_detect_backend(p), model=str(p),
                        options={"attn_implementation": "eager"})
    else:
        preset = get_preset("encoders", str(name_or_path))
    if overrides:
        from dataclasses import replace
        preset = replace(preset, **{k: v for k, v in overrides.items() if k in ("dtype", "revision")},
                         options={**preset.options, **{k: v for k, v in overrides.items()
                                                       if k not in ("dtype", "revision")}})
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if preset.backend == "open_clip":
        import open_clip
        model, _, preprocess = open_clip.create_model_and_transforms(
            preset.model, pretrained=preset.options.get("pretrained"), precision="fp32"
            if preset.dtype == "float32" else ("bf16" if preset.dtype == "bfloat16" else "fp16"), device=device)
        return OpenClipEncoder(model.eval(), open_clip.get_tokenizer(preset.model), preprocess, preset, device)
    if preset.is_local is False and Path(preset.model).is_absolute():
        raise PresetError(f"encoder preset '{preset.name}': {preset.resolved_model} does not exist")
    local = preset.resolved_model
    if "{artifacts}" in preset.model and not Path(local).exists():
        from lib.artifacts import MissingInputError
        raise MissingInputError(f"encoder preset '{preset.name}': {local} does not exist; "
                                f"train it with `make reproduce NB=models`")
    from transformers import AutoModel, AutoProcessor, AutoTokenizer
    kw = _hf_kwargs(preset)
    if preset.backend == "hf_blip":
        from transformers import BlipForImageTextRetrieval
        model = BlipForImageTextRetrieval.from_pretrained(local, **kw)
    else:
        model = AutoModel.from_pretrained(local, **kw)
    tok_kw = {"revision": kw["revision"]} if "revision" in kw else {}
    tokenizer = AutoTokenizer.from_pretrained(local, **tok_kw)
    try:
        processor = AutoProcessor.from_pretrained(local, **tok_kw)
        processor = getattr(processor, "image_processor", processor)
    except (OSError, ValueError, TypeError):
        from transformers import AutoImageProcessor
        processor = AutoImageProcessor.from_pretrained(local, **tok_kw)
    cls = BACKENDS[preset.backend]
    return cls(model.to(device).eval(), tokenizer, processor, preset, device)
