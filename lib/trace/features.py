"""TRACE's inputs: one meme set's images, candidate captions and labels (`MemeBatchData`), and the
frozen parts computed once (`FeatureCache`: image features for every meme, the text hidden states
entering the lowest unfrozen layer for every distinct caption), read by `lib.trace.training.Trainer`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from lib.models.encoders.loading import image_batches


CACHE_DTYPES = ("float32", "float16", "bfloat16")   # FeatureCache.store_dtype


# ----------------------------------------------------------------------------- data and features
@dataclass
class MemeBatchData:
    """Memes as index arrays into the distinct images and distinct caption texts."""
    ids: list[str]
    labels: np.ndarray            # [N]
    splits: list[str]
    image_paths: list[str]
    cap_index: np.ndarray         # [N, K] index into texts (-1 = missing)
    texts: list[str]              # distinct candidate texts
    columns: list[str]            # candidate names: "text" + caption columns
    meta: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_records(cls, records, columns: Sequence[str]) -> "MemeBatchData":
        texts: dict[str, int] = {}
        cap = np.full((len(records), 1 + len(columns)), -1, dtype=np.int64)
        for i, r in enumerate(records):
            for j, c in enumerate(["text", *columns]):
                t = r.text if c == "text" else r.captions.get(c)
                if t and t.strip():
                    cap[i, j] = texts.setdefault(t, len(texts))
        return cls([r.id for r in records], np.array([r.label for r in records], dtype=np.float32),
                   [r.split for r in records], [str(r.img_path) for r in records], cap, list(texts),
                   ["text", *columns], [dict(r.meta) for r in records])

    def subset(self, idx) -> np.ndarray:
        return np.asarray(idx)


class FeatureCache:
    """Frozen backbone outputs computed once: image features and embeddings per meme, and the
    text hidden states entering the lowest unfrozen layer per distinct caption.

    `store_dtype` is the dtype the text hidden states are kept in on the host. float32 (the
    default) makes the cached path equal to the uncached one. Fixed-length towers keep every
    caption at full length (77 x width): FHM's ~30k distinct captions with a 1024-wide tower
    take ~9.5 GB in float32; "float16" or "bfloat16" halves that, at a rounding of the hidden
    states (relative error ~1e-3 for float16) before the unfrozen layers.
    """

    def __init__(self, encoder, data: MemeBatchData, lowest_unfrozen: int, batch_size: int = 128,
                 progress: bool = True, store_dtype: str = "float32", loader_workers: int | None = None):
        """`loader_workers`: threads decoding the memes' image files ahead of the encoder
        (`lib.models.encoders.loading.image_batches`; None: none on a CPU, several on a GPU; the same pixels)."""
        if store_dtype not in CACHE_DTYPES:
            raise ValueError(f"FeatureCache: store_dtype must be one of {', '.join(CACHE_DTYPES)}, not {store_dtype!r}")
        store = getattr(torch, store_dtype)
        self.layer = lowest_unfrozen
        feats, embs = [], []
        with torch.no_grad():
            bar = tqdm(total=len(data.image_paths), desc="cache image features", disable=not progress)
            for part, pix in image_batches(encoder, data.image_paths, batch_size, loader_workers):
                f = encoder.image_features(pix)
                feats.append(f.float().cpu())
                embs.append(encoder.project_image(f).float().cpu())
                bar.update(len(part))
            bar.close()
            self.image_feat = torch.cat(feats)
            self.image_emb = torch.cat(embs)
            tok = encoder.tokenize(data.texts)
            self.tokens = {k: v for k, v in tok.items() if hasattr(v, "shape")}
            hs = []
            for k in tqdm(range(0, len(data.texts), batch_size), desc="cache text hidden states",
                          disable=not progress):
                t = {n: v[k:k + batch_size] for n, v in self.tokens.items()}
                hs.append(encoder.text_hidden_below(t, self.layer).to(store).cpu())
            self.hidden = torch.cat(hs)
        #: backends that pad to the batch's longest text (hf_clip) can run cached rows trimmed to
        #: their own longest; fixed-length towers (SigLIP, open_clip) need the full length
        self.trim = bool(getattr(encoder, "trims_padding", False)) and "attention_mask" in self.tokens

    def text_inputs(self, idx):
        """Cached hidden states and tokens for distinct-text indices `idx`."""
        t = {n: v[idx] for n, v in self.tokens.items()}
        h = self.hidden[idx]
        if self.trim:
            L = int(t["attention_mask"].sum(1).max())
            t = {n: v[:, :L] for n, v in t.items()}
            h = h[:, :L]
        return h.float().contiguous(), t

    @property
    def nbytes(self) -> int:
        """Host memory held by the cached tensors."""
        ts = [self.image_feat, self.image_emb, self.hidden, *self.tokens.values()]
        return sum(t.numel() * t.element_size() for t in ts)


def text_features(encoder, data: MemeBatchData, text_idx, cache: FeatureCache | None, tokens=None):
    """Pooled (pre-projection) features and projected embeddings for the distinct texts `text_idx`."""
    idx = torch.as_tensor(text_idx)
    if cache is not None:
        h, t = cache.text_inputs(idx)
        f = encoder.text_features_from(h.to(encoder.device), t, cache.layer)
    else:
        f = encoder.text_features([data.texts[i] for i in idx.tolist()])
    return f, encoder.project_text(f)


def batch_features(encoder, data: MemeBatchData, rows, cache: FeatureCache | None):
    """Image features/embeddings, candidate caption features [B, K, D] and mask for meme rows."""
    rows = np.asarray(rows)
    if cache is not None:
        img, img_emb = cache.image_feat[rows].to(encoder.device), cache.image_emb[rows].to(encoder.device)
    else:
        with torch.no_grad():
            img = encoder.image_features([Image.open(data.image_paths[i]).convert("RGB") for i in rows]).float()
            img_emb = encoder.project_image(img)
    ci = data.cap_index[rows]                                   # [B, K]
    mask = torch.as_tensor(ci >= 0)
    uniq, inv = np.unique(ci[ci >= 0], return_inverse=True)
    f, e = text_features(encoder, data, uniq, cache)
    B, K = ci.shape
    caps = torch.zeros(B, K, f.shape[-1], device=f.device, dtype=f.dtype)
    cemb = torch.zeros(B, K, e.shape[-1], device=e.device, dtype=e.dtype)
    pos = torch.as_tensor(np.argwhere(ci >= 0))
    caps[pos[:, 0], pos[:, 1]] = f[torch.as_tensor(inv)]
    cemb[pos[:, 0], pos[:, 1]] = e[torch.as_tensor(inv)]
    return img, img_emb, caps, cemb, mask.to(f.device)
