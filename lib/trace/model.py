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
`python -m lib.trace.runs` is the command `accelerate launch` runs (runs and collection live
there; this file is the method read top to bottom).

Evaluation is honest: the decision threshold is chosen on validation only; the official
code's threshold-tuned-on-test number can be computed beside it, labelled optimistic.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence


import torch
import torch.nn as nn
import torch.nn.functional as F


# Deterministic cuBLAS (TrainConfig.deterministic on a GPU) needs a fixed workspace, chosen before
# the process's first cuBLAS call; importing this module before any model runs sets it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

LOSSES = ("cls", "rel", "con")
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
