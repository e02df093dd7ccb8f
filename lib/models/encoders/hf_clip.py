"""Encoder backend `hf_clip`: a Hugging Face CLIPModel (CLIP4DM's attributions run here exactly)."""
from __future__ import annotations

import copy
import numpy as np
import torch
from transformers.masking_utils import create_causal_mask

from lib.models.encoders.base import require_eager
from lib.models.encoders.hf import HFEncoder
from lib.models.encoders.registry import register_encoder


def _clip_layer_at(blk, h, pos, attention_mask, return_weights: bool = False):
    """One CLIP encoder layer evaluated only at position `pos[b]` of each sequence (causal attention
    over positions <= pos, padding masked): the layer's output rows [B, D] at those positions, and
    with `return_weights` also the attention row there, [B, H, 1, T]."""
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
    return torch.arange(n, device=device)


@register_encoder("hf_clip")
class HFClipEncoder(HFEncoder):
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
        bt = getattr(self, "_offsets_tokenizer", None)
        if bt is None:
            src = getattr(self.tokenizer, "backend_tokenizer", None)
            if (src is None or self.tokenizer.pad_token_id is None or self.tokenizer.padding_side != "right"
                    or getattr(self.tokenizer, "truncation_side", "right") != "right"):
                return super().tokenize_with_offsets(texts)
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
        ar = torch.arange(hidden.shape[0], device=hidden.device)
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
        require_eager(self.model, "hf_clip")
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
        require_eager(self.model, "hf_clip")
        inp = self._text_inputs(tokens)
        out = self.model.text_model(input_ids=inp["input_ids"], attention_mask=inp.get("attention_mask"),
                                    output_attentions=True)
        emb = self.model.text_projection(out.pooler_output)
        return emb, tuple(out.attentions), self.pool_index(inp["input_ids"])
