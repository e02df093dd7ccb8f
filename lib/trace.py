"""TRACE: hateful-meme detection by fine-tuning a CLIP-family encoder with caption relevance.

Each meme has several candidate captions (the meme text itself plus one per captioning
model). `CLIPClassifier` scores every candidate with a caption-relevance scorer, selects one
by Gumbel-softmax while training (softmax at inference), projects the image and the selected
caption, lets them attend to each other (bidirectional cross-attention) and classifies.
Losses: classification (0.9 focal + 0.1 BCE), relevance (the same loss on the mean scorer
logit over valid captions) and contrastive (InfoNCE, or sigmoid for SigLIP), combined with
learned uncertainty weights or fixed weights (MultiOFF recipe).

The backbone is frozen except selected text layers (or LoRA adapters on them). Frozen parts
are computed once: image features for every meme and the text hidden states entering the
lowest unfrozen layer for every distinct caption (`FeatureCache`, for every encoder backend);
training then runs only the layers from there on and the classifier (for CLIP, the last layer
at the pooled position only). `FeatureCache=None` runs the full backbone every step and gives
the same numbers. `Trainer(..., accelerator=...)` trains over several processes (GPUs);
`python -m lib.trace_report` is the command `accelerate launch` runs (runs and collection live
there; this file is the method read top to bottom).

Evaluation is honest: the decision threshold is chosen on validation only; the official
code's threshold-tuned-on-test number can be computed beside it, labelled optimistic.
"""
from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import random
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from tqdm.auto import tqdm

from lib.artifacts import write_with
from lib.encoders.loading import image_batches
from lib.metrics import best_threshold, metrics_at, pr_best_f1_threshold

# Deterministic cuBLAS (TrainConfig.deterministic on a GPU) needs a fixed workspace, chosen before
# the process's first cuBLAS call; importing this module before any model runs sets it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

LOSSES = ("cls", "rel", "con")
CACHE_DTYPES = ("float32", "float16", "bfloat16")   # FeatureCache.store_dtype
LOSS_CONFIGS = {"cls+rel": ("cls", "rel"), "cls+con": ("cls", "con"), "all": ("cls", "rel", "con")}


# ----------------------------------------------------------------------------- model
def _wn(linear):
    return nn.utils.parametrizations.weight_norm(linear)


def build_classifier(image_dim: int, text_dim: int, hidden: int = 1024, heads: int = 8, *,
                     scorer_input: str = "caption", scorer_arch: str = "full",
                     scorer_dropout: Sequence[float] = (0.5, 0.4, 0.3), proj_dropout: float = 0.3,
                     attn_dropout: float = 0.3, head_dropout: float = 0.5, head_final_dropout: bool = True,
                     xavier: str = "scorer", selection_temperature: float | None = None,
                     gumbel_over: str = "logits", mask_padded: bool = True):
    """The TRACE classifier head over backbone features (see the module docstring).

    Defaults are the official ViT-L/14 script's: the scorer reads the caption feature alone
    (`scorer_input="image+caption"` is this compendium's variant), Xavier init on the scorer only,
    cosine selection (relevance off) on the raw cosine (`selection_temperature` divides it),
    Gumbel over the scorer's logits (`gumbel_over="probs"`: over sigmoid probabilities, the
    MultiOFF script). `scorer_arch="small"` is the MultiOFF script's scorer (Linear -> H,
    weight-normed Linear -> H/2, Linear -> 1). `head_final_dropout=False`: the open_clip scripts'
    head, without the Dropout before its last Linear. `mask_padded=False`: the official code, where
    a hard Gumbel pick can land on an empty caption slot.
    """
    if scorer_input not in ("caption", "image+caption"):
        raise ValueError(f"scorer_input must be 'caption' or 'image+caption', not {scorer_input!r}")
    if scorer_arch not in ("full", "small"):
        raise ValueError(f"scorer_arch must be 'full' or 'small', not {scorer_arch!r}")
    if gumbel_over not in ("logits", "probs"):
        raise ValueError(f"gumbel_over must be 'logits' or 'probs', not {gumbel_over!r}")
    if xavier not in ("scorer", "all"):
        raise ValueError(f"xavier must be 'scorer' or 'all', not {xavier!r}")

    def lin(i, o, wn=False):
        layer = nn.Linear(i, o)
        nn.init.xavier_uniform_(layer.weight)            # the scorer's init (before weight norm)
        nn.init.zeros_(layer.bias)
        return _wn(layer) if wn else layer

    class _CLIPClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            H = hidden
            d_in = text_dim + (image_dim if scorer_input == "image+caption" else 0)
            d1, d2, d3 = scorer_dropout
            if scorer_arch == "full":
                self.caption_scorer = nn.Sequential(
                    lin(d_in, H), nn.LayerNorm(H), nn.GELU(), nn.Dropout(d1),
                    lin(H, H, True), nn.LayerNorm(H), nn.GELU(), nn.Dropout(d2),
                    lin(H, H, True), nn.LayerNorm(H), nn.GELU(), nn.Dropout(d2),
                    lin(H, H // 2, True), nn.LayerNorm(H // 2), nn.GELU(), nn.Dropout(d3),
                    lin(H // 2, 1))
            else:
                self.caption_scorer = nn.Sequential(
                    lin(d_in, H), nn.LayerNorm(H), nn.GELU(), nn.Dropout(d1),
                    lin(H, H // 2, True), nn.LayerNorm(H // 2), nn.GELU(), nn.Dropout(d3),
                    lin(H // 2, 1))
            self.image_proj = nn.Sequential(nn.Linear(image_dim, H), nn.LayerNorm(H), nn.ReLU(), nn.Dropout(proj_dropout))
            self.text_proj = nn.Sequential(nn.Linear(text_dim, H), nn.LayerNorm(H), nn.ReLU(), nn.Dropout(proj_dropout))
            self.img2txt = nn.MultiheadAttention(H, heads, dropout=attn_dropout, batch_first=True)
            self.txt2img = nn.MultiheadAttention(H, heads, dropout=attn_dropout, batch_first=True)
            blocks: list[nn.Module] = [nn.Dropout(head_dropout)]
            d = 2 * H
            for k in range(3):
                blocks += [nn.Linear(d, H), nn.LayerNorm(H), nn.ReLU()]
                if k < 2 or head_final_dropout:
                    blocks.append(nn.Dropout(head_dropout))
                d = H
            blocks.append(nn.Linear(H, 1))
            self.head = nn.Sequential(*blocks)
            self.log_vars = nn.Parameter(torch.zeros(3))
            if xavier == "all":
                for m in self.modules():
                    if isinstance(m, nn.Linear) and not hasattr(m, "parametrizations"):
                        nn.init.xavier_uniform_(m.weight)
                        nn.init.zeros_(m.bias)

        def forward(self, img, caps, cap_mask, cap_emb=None, img_emb=None, relevance: bool = True,
                    tau: float = 1.0, hard: bool = True, modality: str = "both", allowed=None):
            """img [B, Di]; caps [B, K, Dt]; cap_mask [B, K] bool (a caption exists); cap_emb / img_emb:
            the backbone's projected embeddings (cosine selection when the relevance scorer is off,
            and the official contrastive features); allowed [K] bool: candidate columns this model
            may select (the unimodal baselines), masked whatever `mask_padded` says."""
            if modality in ("text", "caption"):
                img = torch.zeros_like(img)
                img_emb = None if img_emb is None else torch.zeros_like(img_emb)
            B, K, _ = caps.shape
            scorer_in = caps if scorer_input == "caption" else torch.cat([img.unsqueeze(1).expand(B, K, -1), caps], -1)
            scores = self.caption_scorer(scorer_in).squeeze(-1)                   # [B, K]
            if relevance or cap_emb is None:
                sel_logits = scores.sigmoid() if gumbel_over == "probs" else scores
            else:
                sel_logits = (F.normalize(img_emb, dim=-1).unsqueeze(1) * F.normalize(cap_emb, dim=-1)).sum(-1)
                if selection_temperature:
                    sel_logits = sel_logits / selection_temperature
            block = torch.zeros_like(cap_mask) if allowed is None else ~allowed.to(cap_mask.device).expand(B, K)
            if mask_padded:
                block = block | ~cap_mask
            sel_logits = sel_logits.masked_fill(block, -1e4)
            if self.training:
                weights = F.gumbel_softmax(sel_logits, tau=tau, hard=hard)
            else:
                weights = sel_logits.softmax(-1)
            txt = torch.bmm(weights.unsqueeze(1), caps).squeeze(1)                 # [B, Dt]
            if modality == "image":
                txt = torch.zeros_like(txt)
            ip, tp = self.image_proj(img), self.text_proj(txt)
            q_i, q_t = ip.unsqueeze(1), tp.unsqueeze(1)
            i2 = ip + self.img2txt(q_i, q_t, q_t, need_weights=False)[0].squeeze(1)
            t2 = tp + self.txt2img(q_t, q_i, q_i, need_weights=False)[0].squeeze(1)
            logit = self.head(torch.cat([i2, t2], -1)).squeeze(-1)
            out = {"logit": logit, "scores": scores, "weights": weights, "img_proj": ip, "txt_proj": tp,
                   "select_mask": cap_mask & ~block if allowed is not None else cap_mask}
            if cap_emb is not None and img_emb is not None:
                out["img_emb"] = img_emb
                out["sel_emb"] = torch.bmm(weights.unsqueeze(1), cap_emb).squeeze(1)         # the selected caption
                out["argmax_emb"] = cap_emb[torch.arange(B, device=cap_emb.device), weights.argmax(-1)]
            return out

    return _CLIPClassifier()


#: The TRACE classifier (a torch module built for the backbone's feature widths).
CLIPClassifier = build_classifier


# ----------------------------------------------------------------------------- losses
def focal_bce(logit, target, alpha: float = 0.25, gamma: float = 2.0, focal_weight: float = 0.9):
    """focal_weight x focal (alpha on positives, gamma) + (1 - focal_weight) x BCE, on logits."""
    bce = F.binary_cross_entropy_with_logits(logit, target, reduction="none")
    p = torch.sigmoid(logit)
    pt = torch.where(target > 0.5, p, 1 - p)
    at = torch.where(target > 0.5, torch.full_like(p, alpha), torch.full_like(p, 1 - alpha))
    focal = at * (1 - pt) ** gamma * bce
    return focal_weight * focal.mean() + (1 - focal_weight) * bce.mean()


def info_nce(a, b, tau: float = 0.07):
    """Symmetric InfoNCE between rows of a and b at temperature tau."""
    a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    logits = a @ b.T / tau
    t = torch.arange(len(a), device=a.device)
    return 0.5 * (F.cross_entropy(logits, t) + F.cross_entropy(logits.T, t))


def sigmoid_contrastive(a, b, tau: float = 0.07):
    """The official SigLIP-backbone contrastive term: BCE-with-logits on cos / tau against the
    identity (1 on matching pairs, 0 elsewhere), averaged over all B^2 pairs."""
    a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    logits = a @ b.T / tau
    return F.binary_cross_entropy_with_logits(logits, torch.eye(len(a), device=a.device, dtype=logits.dtype))


CONTRASTIVE_FEATURES = ("clip", "head")


def trace_loss(out: dict[str, Any], labels, cap_mask, enabled: Sequence[str], log_vars=None,
               fixed_weights: dict[str, float] | None = None, sigmoid: bool = False, *,
               focal: dict[str, float] | None = None, contrastive_features: str = "clip",
               contrastive_caption: str = "selected", contrastive_temperature: float = 0.07) -> tuple[Any, dict[str, float]]:
    """The enabled losses combined by uncertainty weighting sum_k exp(-s_k) L_k + 0.5 s_k (or fixed weights).

    focal: {alpha, gamma, focal_weight} for the classification and relevance losses.
    contrastive_features: "clip" (official) compares the backbone's projected image embedding with
    the selected caption's projected text embedding; "head" compares the head's own projections.
    contrastive_caption: "selected" (the Gumbel pick, straight-through) or "argmax" (MultiOFF)."""
    focal = focal or {}
    parts = {}
    if "cls" in enabled:
        parts["cls"] = focal_bce(out["logit"], labels, **focal)
    if "rel" in enabled:
        m = cap_mask.float()
        mean_score = (out["scores"] * m).sum(-1) / m.sum(-1).clamp(min=1)
        parts["rel"] = focal_bce(mean_score, labels, **focal)
    if "con" in enabled and len(labels) > 1:
        if contrastive_features not in CONTRASTIVE_FEATURES:
            raise ValueError(f"contrastive_features must be one of {CONTRASTIVE_FEATURES}, not {contrastive_features!r}")
        if contrastive_features == "clip":
            if "img_emb" not in out:
                raise ValueError("contrastive_features='clip' needs the backbone's projected embeddings in the forward")
            a, b = out["img_emb"], out["argmax_emb" if contrastive_caption == "argmax" else "sel_emb"]
        else:
            a, b = out["img_proj"], out["txt_proj"]
        fn = sigmoid_contrastive if sigmoid else info_nce
        parts["con"] = fn(a, b, contrastive_temperature)
    total = 0.0
    for k, v in parts.items():
        if fixed_weights is not None:
            total = total + fixed_weights.get(k, 0.0) * v
        else:
            s = log_vars[LOSSES.index(k)]
            total = total + (-s).exp() * v + 0.5 * s
    return total, {k: float(v.detach()) for k, v in parts.items()}


def gumbel_tau(epoch: int, epochs: int, start: float = 1.0, decay: float = 0.9, floor: float = 0.1) -> float:
    """tau = max(start - decay * e / E, floor) at epoch e of E (0-based)."""
    return max(start - decay * epoch / max(1, epochs), floor)


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
        (`lib.encoders.loading.image_batches`; None: none on a CPU, several on a GPU; the same pixels)."""
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


# ----------------------------------------------------------------------------- training
@dataclass
class TrainConfig:
    """Everything that shapes one TRACE run. The defaults are the official ViT-L/14 script's
    behaviour except where marked "deliberate" (an improvement kept as the default, with the
    official behaviour one field away)."""
    loss_config: str = "cls+rel"          # cls+rel (default) | cls+con | all
    modality: str = "both"                # both | text (meme text only) | caption (captions only) | image |
                                          # image_text (image and meme text, no caption: what captions add)
    unfreeze_text_layers: tuple[int, ...] = (-1,)   # relative to the last text layer (-1 = last)
    lora_rank: int = 0                    # > 0: LoRA (peft) on the unfrozen layers' attention instead of full tuning
    hidden: int = 1024
    heads: int = 8
    epochs: int = 30
    batch_size: int = 128
    grad_accum: int = 4                   # effective batch = batch_size * grad_accum
    lr: float = 1e-4
    weight_decay: float = 0.01            # AdamW's default, which the official scripts keep
    grad_clip: float = 1.0
    patience: int = 5                     # early stopping on validation AUROC (or macro-F1)
    lr_patience: int = 2                  # ReduceLROnPlateau(max, factor 0.1, min_lr)
    min_lr: float = 1e-7
    select_on: str = "auroc"              # auroc | macro_f1 (MultiOFF)
    fixed_weights: dict[str, float] | None = None   # MultiOFF: {"cls": 1, "con": 0.3, "rel": 0.7}
    sigmoid_contrastive: bool = False     # SigLIP backbones: BCE on cos / temperature over B^2 pairs
    # -- the method's constants
    focal_alpha: float = 0.25
    focal_gamma: float = 2.0
    focal_weight: float = 0.9             # focal x this + BCE x (1 - this)
    tau_start: float = 1.0                # Gumbel tau = max(tau_start - tau_decay * e / E, tau_min)
    tau_decay: float = 0.9
    tau_min: float = 0.1
    contrastive_temperature: float = 0.07
    selection_temperature: float | None = None   # cosine selection: raw cosine (official); 0.07 divides it
    scorer_input: str = "caption"         # caption (official) | image+caption
    scorer_arch: str = "full"             # full | small (the MultiOFF script's scorer)
    gumbel_over: str = "logits"           # logits | probs (MultiOFF: Gumbel over sigmoid probabilities)
    contrastive_features: str = "clip"    # clip (backbone embeddings, official) | head (the head's projections)
    contrastive_caption: str = "selected"  # selected (Gumbel pick) | argmax (MultiOFF)
    scorer_dropout: tuple[float, float, float] = (0.5, 0.4, 0.3)
    proj_dropout: float = 0.3
    attn_dropout: float = 0.3
    head_dropout: float = 0.5
    head_final_dropout: bool | None = None   # None: by backbone (open_clip scripts have none)
    head_inputs: str = "auto"             # auto (pooled for HF backbones, projected for open_clip) | pooled | projected
    xavier: str = "scorer"                # scorer (official) | all
    val_threshold_by: str = "accuracy"    # the decision threshold maximises this on validation
    # -- deliberate departures, each with the official behaviour as its other value
    mask_padded: bool = True              # deliberate; False: a hard Gumbel pick can land on an empty slot
    restore_best: bool = True             # deliberate; False: keep the last epoch's weights
    # -- engineering
    cache_frozen: bool = True
    cache_dtype: str = "float32"          # host dtype of cached text hidden states (float16/bfloat16 halve memory)
    amp: bool = True                      # autocast bf16 on GPU; ignored on CPU
    seed: int = 121
    deterministic: bool = True            # torch deterministic algorithms (warn-only): the same run twice gives
                                          # the same numbers (without it, 1e-7 differences in accumulated
                                          # gradients grow into different models over 12 epochs)

    def __post_init__(self):
        self.unfreeze_text_layers = tuple(self.unfreeze_text_layers)
        self.scorer_dropout = tuple(self.scorer_dropout)
        if self.loss_config not in LOSS_CONFIGS:
            raise ValueError(f"TrainConfig.loss_config must be one of {', '.join(LOSS_CONFIGS)}, not {self.loss_config!r}")
        if self.modality not in MODALITIES:
            raise ValueError(f"TrainConfig.modality must be one of {', '.join(MODALITIES)}, not {self.modality!r}")
        if self.head_inputs not in ("auto", "pooled", "projected"):
            raise ValueError(f"TrainConfig.head_inputs must be auto, pooled or projected, not {self.head_inputs!r}")
        if self.contrastive_caption not in ("selected", "argmax"):
            raise ValueError(f"TrainConfig.contrastive_caption must be selected or argmax, not {self.contrastive_caption!r}")
        if len(self.scorer_dropout) != 3:
            raise ValueError("TrainConfig.scorer_dropout takes three rates (first block, middle blocks, last block)")


MODALITIES = ("both", "text", "caption", "image", "image_text")


#: the candidate columns each modality may select ("text" is the meme text)
def allowed_columns(columns: Sequence[str], modality: str) -> list[bool]:
    """Which candidate columns a model of this modality may select: the text-only baseline reads
    only the meme text, the caption-only baseline only the captioners' columns (which describe the
    image: not a text-only model), image_text the image and the meme text but no caption (the
    default model minus its captions: the test of what captions add), the others every column."""
    if modality in ("text", "image_text"):
        return [c == "text" for c in columns]
    if modality == "caption":
        return [c != "text" for c in columns]
    return [True] * len(columns)


def unfrozen_layer_indices(encoder, unfreeze_text_layers: Sequence[int]) -> list[int]:
    """0-based text layer indices, sorted, from the config's numbers (negative = from the last layer)."""
    n = len(encoder.text_layers())
    return sorted({(n + i) if i < 0 else i for i in unfreeze_text_layers})


def set_trainable(encoder, cfg: TrainConfig) -> list[int]:
    """Freeze the backbone except the chosen text layers (or LoRA adapters on them); return their indices."""
    layers = encoder.text_layers()
    idx = unfrozen_layer_indices(encoder, cfg.unfreeze_text_layers)
    for p in encoder.model.parameters():
        p.requires_grad_(False)
    if cfg.lora_rank > 0:
        from peft import LoraConfig, inject_adapter_in_model  # lazy on purpose: only LoRA runs need peft
        targets = lora_targets(encoder, idx)
        inject_adapter_in_model(LoraConfig(r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, target_modules=targets),
                                encoder.model)
        for name, p in encoder.model.named_parameters():
            p.requires_grad_("lora_" in name)
    else:
        for i in idx:
            for p in layers[i].parameters():
                p.requires_grad_(True)
    return idx


_QV = ("q_proj", "v_proj", "query", "value")


def lora_targets(encoder, layer_idx) -> list[str]:
    """Full module names for LoRA in the given text layers: the attention query/value projections
    (HF CLIP/SigLIP `q_proj`/`v_proj`, (XLM-)RoBERTa `query`/`value`), or every linear layer of
    the block where the attention is a fused nn.MultiheadAttention (open_clip's native tower)."""
    layers = encoder.text_layers()
    names = {id(m): n for n, m in encoder.model.named_modules()}
    out = []
    for i in layer_idx:
        prefix = names[id(layers[i])]
        lin = [(n, m) for n, m in layers[i].named_modules() if isinstance(m, nn.Linear)]
        qv = [n for n, _ in lin if n.rsplit(".", 1)[-1] in _QV]
        out += [f"{prefix}.{n}" for n in (qv or [n for n, _ in lin])]
    if not out:
        raise ValueError(f"{type(encoder).__name__}: no linear layers found for LoRA in text layers {list(layer_idx)}")
    return out


def head_inputs(encoder, cfg: TrainConfig) -> str:
    """pooled or projected: what the head and scorer read (official: projected on open_clip backbones)."""
    if cfg.head_inputs != "auto":
        return cfg.head_inputs
    return "projected" if getattr(encoder, "backend", "") == "open_clip" else "pooled"


def head_final_dropout(encoder, cfg: TrainConfig) -> bool:
    if cfg.head_final_dropout is not None:
        return bool(cfg.head_final_dropout)
    return getattr(encoder, "backend", "") != "open_clip"


def _embed_dims(encoder) -> tuple[int, int]:
    """Widths of the backbone's projected image and text embeddings."""
    with torch.no_grad():
        dev = encoder.device
        i = encoder.project_image(torch.zeros(1, encoder.image_dim, device=dev))
        t = encoder.project_text(torch.zeros(1, encoder.text_dim, device=dev))
    return int(i.shape[-1]), int(t.shape[-1])


class CheckpointMismatch(ValueError):
    """A run folder's checkpoint belongs to another configuration."""


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read safely (corrupt, truncated, or holding more than
    tensors and plain values); the message names the file and how to resume."""


def _plain(value: Any) -> Any:
    """Numpy scalars and arrays as Python numbers and lists, recursively: a checkpoint then holds only
    what torch's weights_only loader accepts (tensors, containers, numbers, strings)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_checkpoint(path: Any, map_location: Any = "cpu") -> dict[str, Any]:
    """A training checkpoint read with torch's weights_only loader: tensors, containers, numbers and
    strings only, so a crafted file cannot run code. A file that fails is a CheckpointError naming it."""
    try:
        ck = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for a bad file
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise CheckpointError(
            f"{path}: not a readable training checkpoint ({type(e).__name__}: {first}). It is corrupt, truncated, "
            f"from an older version of the compendium, or holds objects other than tensors and plain values "
            f"(refused: loading it could run code). Move it aside or delete it and run again: the run then "
            f"starts from its first epoch") from None
    if not isinstance(ck, dict) or "epoch" not in ck:
        raise CheckpointError(f"{path}: not a training checkpoint (no 'epoch' entry); move it aside or delete it "
                              f"and run again: the run then starts from its first epoch")
    return ck


class Trainer:
    """Fine-tunes `CLIPClassifier` (+ the unfrozen text layers) on MemeBatchData."""

    def __init__(self, encoder, data: MemeBatchData, cfg: TrainConfig, cache: FeatureCache | None = None,
                 progress: bool = True, accelerator=None):
        """accelerator: an `accelerate.Accelerator` for multi-process (multi-GPU) training: every process
        takes its share of each epoch's batches and gradients are averaged over processes before each
        optimizer step, so all processes hold the same weights (the encoder must already be on
        `accelerator.device`)."""
        self.encoder, self.data, self.cfg, self.progress = encoder, data, cfg, progress
        self.acc = accelerator
        self.world = accelerator.num_processes if accelerator is not None else 1
        self.rank = accelerator.process_index if accelerator is not None else 0
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            if torch.cuda.is_available() and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
                warnings.warn("deterministic training on a GPU needs CUBLAS_WORKSPACE_CONFIG=:4096:8 set before "
                              "the first cuBLAS call (import lib.trace first, or export it)")
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.unfrozen = set_trainable(encoder, cfg)
        if cfg.cache_frozen and cache is not None and cache.layer > min(self.unfrozen):
            raise ValueError(f"feature cache stops at layer {cache.layer} but layer {min(self.unfrozen)} is unfrozen")
        self.cache = cache if cfg.cache_frozen else None
        self.inputs = head_inputs(encoder, cfg)
        dims = _embed_dims(encoder) if self.inputs == "projected" else (encoder.image_dim, encoder.text_dim)
        self.model = build_classifier(
            *dims, cfg.hidden, cfg.heads, scorer_input=cfg.scorer_input, scorer_arch=cfg.scorer_arch,
            scorer_dropout=cfg.scorer_dropout, proj_dropout=cfg.proj_dropout, attn_dropout=cfg.attn_dropout,
            head_dropout=cfg.head_dropout, head_final_dropout=head_final_dropout(encoder, cfg), xavier=cfg.xavier,
            selection_temperature=cfg.selection_temperature, gumbel_over=cfg.gumbel_over,
            mask_padded=cfg.mask_padded).to(encoder.device)
        self.allowed = torch.tensor(allowed_columns(data.columns, cfg.modality), device=encoder.device)
        if not bool(self.allowed.any()):
            raise ValueError(f"TrainConfig.modality={cfg.modality!r} leaves no candidate column among {data.columns}")
        self.enabled = LOSS_CONFIGS[cfg.loss_config]
        self.relevance = "rel" in self.enabled
        params = [p for p in self.model.parameters()] + [p for p in encoder.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.ReduceLROnPlateau(self.opt, mode="max", factor=0.1,
                                                                patience=cfg.lr_patience, min_lr=cfg.min_lr)
        self.curve: list[dict[str, Any]] = []
        self._params = params
        self._focal = {"alpha": cfg.focal_alpha, "gamma": cfg.focal_gamma, "focal_weight": cfg.focal_weight}

    def _forward(self, rows, train: bool, tau: float = 1.0):
        img, img_emb, caps, cemb, mask = batch_features(self.encoder, self.data, rows, self.cache)
        if self.inputs == "projected":
            img, caps = img_emb, cemb
        dev = self.encoder.device
        use_amp = self.cfg.amp and dev.startswith("cuda")
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=use_amp):
            out = self.model(img.float(), caps.float(), mask, cemb.float(), img_emb.float(), relevance=self.relevance,
                             tau=tau, hard=True, modality=self.cfg.modality, allowed=self.allowed)
        return out, out["select_mask"]

    def tau(self, epoch: int) -> float:
        c = self.cfg
        return gumbel_tau(epoch, c.epochs, c.tau_start, c.tau_decay, c.tau_min)

    def epoch(self, rows: np.ndarray, epoch: int) -> dict[str, float]:
        cfg = self.cfg
        self.model.train()
        self.encoder.model.train()
        perm = np.random.permutation(rows)            # the same on every process (same seed)
        tau = self.tau(epoch)
        t0, losses = time.time(), []
        picks = np.zeros(len(self.data.columns))
        self.opt.zero_grad(set_to_none=True)
        n_batches = math.ceil(len(perm) / (cfg.batch_size * self.world))
        for b in tqdm(range(n_batches), desc=f"epoch {epoch + 1}", disable=not self.progress or self.rank > 0,
                      leave=False):
            big = perm[b * cfg.batch_size * self.world:(b + 1) * cfg.batch_size * self.world]
            r = big[self.rank::self.world]
            scale = 1.0
            if len(r) == 0:                           # a short last batch: this process adds zero gradient
                r, scale = big[:1], 0.0
            out, mask = self._forward(r, True, tau)
            y = torch.as_tensor(self.data.labels[r], device=out["logit"].device)
            loss, parts = trace_loss(out, y, mask, self.enabled, self.model.log_vars, cfg.fixed_weights,
                                     cfg.sigmoid_contrastive, focal=self._focal,
                                     contrastive_features=cfg.contrastive_features,
                                     contrastive_caption=cfg.contrastive_caption,
                                     contrastive_temperature=cfg.contrastive_temperature)
            (scale * loss / cfg.grad_accum).backward()
            if (b + 1) % cfg.grad_accum == 0 or b + 1 == n_batches:
                self._sync_gradients()
                torch.nn.utils.clip_grad_norm_(self._params, cfg.grad_clip)
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if scale:
                picks += np.bincount(out["weights"].detach().argmax(-1).cpu().numpy(), minlength=len(picks))
        share = picks / max(1, picks.sum())
        return {"loss": float(np.mean(losses)), "seconds": time.time() - t0, "tau": tau,
                "train_pick_share": {c: float(s) for c, s in zip(self.data.columns, share)}}

    def _sync_gradients(self) -> None:
        """Average gradients over processes (what DDP does), one flat all-reduce per step."""
        if self.world <= 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat = self.acc.reduce(flat, reduction="mean")
        at = 0
        for p, g in zip(self._params, grads):
            n = g.numel()
            p.grad = flat[at:at + n].view_as(p).clone()
            at += n

    def time_epoch(self, rows: np.ndarray, repeats: int = 3) -> float:
        """Seconds for one training epoch over `rows`: the fastest of `repeats` (the first pays warm-up)."""
        return min(self.epoch(np.asarray(rows), 0)["seconds"] for _ in range(max(1, repeats)))

    def predict(self, rows: np.ndarray, batch_size: int = 512) -> tuple[np.ndarray, np.ndarray]:
        """Probabilities and the per-candidate selection weights for meme rows."""
        self.model.eval()
        self.encoder.model.eval()
        probs, weights = [], []
        with torch.no_grad():
            for k in range(0, len(rows), batch_size):
                out, _ = self._forward(rows[k:k + batch_size], False)
                probs.append(torch.sigmoid(out["logit"]).float().cpu().numpy())
                weights.append(out["weights"].float().cpu().numpy())
        return np.concatenate(probs), np.concatenate(weights)

    # -- checkpoints: everything an interrupted fit needs to continue as if it had not stopped
    def _trainable_state(self) -> dict[str, Any]:
        return {n: p.detach().clone() for n, p in self.encoder.model.named_parameters() if p.requires_grad}

    def load_trainable(self, state: dict[str, Any]) -> None:
        named = dict(self.encoder.model.named_parameters())
        with torch.no_grad():
            for n, v in state.items():
                named[n].copy_(v)

    def _checkpoint_state(self, epoch: int, best: float, best_state, bad: int) -> dict[str, Any]:
        # version 2: numpy values as Python numbers and lists, so the file loads with weights_only=True
        return {"version": 2, "config": _plain(asdict(self.cfg)), "epoch": epoch, "best": float(best), "bad": bad,
                "best_state": best_state, "model": self.model.state_dict(), "trainable": self._trainable_state(),
                "opt": self.opt.state_dict(), "sched": _plain(self.sched.state_dict()), "curve": _plain(self.curve),
                "rng": {"torch": torch.get_rng_state(), "numpy": _plain(np.random.get_state()),
                        "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}

    def _restore(self, ck: dict[str, Any]) -> None:
        self.model.load_state_dict(ck["model"])
        self.load_trainable(ck["trainable"])
        self.opt.load_state_dict(ck["opt"])
        self.sched.load_state_dict(ck["sched"])
        self.curve = list(ck["curve"])
        torch.set_rng_state(ck["rng"]["torch"])
        name, keys, pos, has_gauss, gauss = ck["rng"]["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
        py = ck["rng"]["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        if ck["rng"].get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ck["rng"]["cuda"])

    def fit(self, train_rows, val_rows, checkpoint=None, on_epoch_end=None) -> dict[str, Any]:
        """Train with ReduceLROnPlateau and early stopping on validation; keep the best state
        (`restore_best`; the official code keeps the last).

        checkpoint: a file path; after every epoch the full training state (weights, optimiser,
        scheduler, curve, best state, random generators) is written there atomically, and a fit that
        finds one for the same configuration continues after its last epoch with the same result
        as an uninterrupted fit. on_epoch_end(epoch_record): called after each epoch's checkpoint."""
        cfg = self.cfg
        best, best_state, bad, start = -1.0, None, 0, 0
        if checkpoint is not None and Path(checkpoint).exists():
            ck = load_checkpoint(checkpoint, map_location=self.encoder.device)
            if ck.get("config") != asdict(cfg):
                diff = sorted(k for k in asdict(cfg) if ck.get("config", {}).get(k) != asdict(cfg)[k])
                raise CheckpointMismatch(f"{checkpoint}: written for another configuration (differs in "
                                         f"{', '.join(diff)}); move it aside or restore that configuration")
            self._restore(ck)
            best, best_state, bad, start = ck["best"], ck["best_state"], ck["bad"], ck["epoch"] + 1
            stopped = ck.get("stopped", False)
            if stopped:
                start = cfg.epochs
        for e in range(start, cfg.epochs):
            ep = self.epoch(np.asarray(train_rows), e)
            pv, _ = self.predict(np.asarray(val_rows))
            yv = self.data.labels[np.asarray(val_rows)].astype(int)
            vm = metrics_at(pv, yv, best_threshold(pv, yv, cfg.val_threshold_by))
            score = vm[cfg.select_on]
            self.sched.step(score)
            self.curve.append({"epoch": e + 1, **ep, "val_auroc": vm["auroc"], "val_macro_f1": vm["macro_f1"],
                               "val_accuracy": vm["accuracy"], "lr": self.opt.param_groups[0]["lr"]})
            if score > best + 1e-6:
                best, bad = score, 0
                best_state = (copy.deepcopy(self.model.state_dict()), self._trainable_state(), e + 1)
            else:
                bad += 1
            stop = bad >= cfg.patience
            if checkpoint is not None:
                state = self._checkpoint_state(e, best, best_state, bad)
                state["stopped"] = stop
                write_with(Path(checkpoint), lambda tmp: torch.save(state, tmp))
            if on_epoch_end is not None:
                on_epoch_end(self.curve[-1])
            if stop:
                break
        best_epoch = len(self.curve)
        if cfg.restore_best and best_state is not None:
            self.model.load_state_dict(best_state[0])
            self.load_trainable(best_state[1])
            best_epoch = best_state[2]
        return {"best_val": best, "epochs_run": len(self.curve), "best_epoch": best_epoch}

    def evaluate(self, val_rows, test_splits: dict[str, np.ndarray]) -> dict[str, Any]:
        """Threshold from validation only; per-split metrics, the official threshold-on-test number
        (best-F1 point of the split's own precision-recall curve) labelled optimistic, and
        predictions (id, probability, threshold, prediction, label, selected caption and its weight)."""
        pv, _ = self.predict(np.asarray(val_rows))
        yv = self.data.labels[np.asarray(val_rows)].astype(int)
        thr = best_threshold(pv, yv, self.cfg.val_threshold_by)
        out: dict[str, Any] = {"threshold": thr, "val": metrics_at(pv, yv, thr), "splits": {}, "predictions": []}
        for split, rows in test_splits.items():
            rows = np.asarray(rows)
            p, w = self.predict(rows)
            y = self.data.labels[rows].astype(int)
            m = metrics_at(p, y, thr)
            if len(set(y.tolist())) == 2:
                t_opt = pr_best_f1_threshold(p, y)
                m["accuracy_optimistic_threshold_on_test"] = metrics_at(p, y, t_opt)["accuracy"]
                m["macro_f1_optimistic_threshold_on_test"] = metrics_at(p, y, t_opt)["macro_f1"]
            out["splits"][split] = m
            out.setdefault("mean_weight", {})[split] = {c: float(x) for c, x in zip(self.data.columns, w.mean(0))}
            for i, r in enumerate(rows):
                k = int(np.argmax(w[i]))
                out["predictions"].append({"id": self.data.ids[r], "split": split, "probability": float(p[i]),
                                           "threshold": thr, "prediction": int(p[i] >= thr), "label": int(y[i]),
                                           "selected": self.data.columns[k], "selected_weight": float(w[i][k])})
        return out


#: the official MultiOFF script (CLIP-RoBERTa B/32, last text layer)
MULTIOFF_RECIPE = {"loss_config": "all", "fixed_weights": {"cls": 1.0, "con": 0.3, "rel": 0.7},
                   "select_on": "macro_f1", "unfreeze_text_layers": (-1,), "batch_size": 32, "grad_accum": 4,
                   "epochs": 20, "seed": 42, "weight_decay": 0.01, "grad_clip": 2.0, "scorer_arch": "small",
                   "gumbel_over": "probs", "contrastive_caption": "argmax"}
#: the official FHM script's settings (ViT-L/14): TrainConfig's defaults plus its unfrozen layers
OFFICIAL_FHM = {"unfreeze_text_layers": (-2, -5, -8)}
#: deliberate departures kept as defaults, with the official behaviour
DELIBERATE = {"mask_padded": (True, False), "restore_best": (True, False)}


def config_diff(cfg: TrainConfig, dataset: str = "fhm") -> list[dict[str, Any]]:
    """Every TrainConfig field where `cfg` differs from the official script for `dataset`, plus the
    deliberate departures (rows: setting, official, this run)."""
    ref = TrainConfig(**(MULTIOFF_RECIPE if dataset == "multioff" else OFFICIAL_FHM))
    engineering = {"cache_frozen", "cache_dtype", "amp", "deterministic"}
    rows = []
    for k in TrainConfig.__dataclass_fields__:
        if k in engineering:
            continue
        a, b = getattr(ref, k), getattr(cfg, k)
        if k in DELIBERATE and a == b:
            a = DELIBERATE[k][1]
        if a != b:
            rows.append({"setting": k, "official": a, "this run": b,
                         "why": "deliberate (documented)" if k in DELIBERATE else "profile"})
    return rows
