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
`python -m lib.trace` is the command `accelerate launch` runs.

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

import numpy as np

# Deterministic cuBLAS (TrainConfig.deterministic on a GPU) needs a fixed workspace, chosen before
# the process's first cuBLAS call; importing this module before any model runs sets it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

LOSSES = ("cls", "rel", "con")
CACHE_DTYPES = ("float32", "float16", "bfloat16")   # FeatureCache.store_dtype
LOSS_CONFIGS = {"cls+rel": ("cls", "rel"), "cls+con": ("cls", "con"), "all": ("cls", "rel", "con")}


# ----------------------------------------------------------------------------- model
def _wn(linear):
    import torch.nn as nn
    return nn.utils.parametrizations.weight_norm(linear)


def build_classifier(image_dim: int, text_dim: int, hidden: int = 1024, heads: int = 8):
    """The TRACE classifier head over backbone features (see the module docstring)."""
    import torch
    import torch.nn as nn

    class _CLIPClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            H = hidden
            self.caption_scorer = nn.Sequential(
                nn.Linear(image_dim + text_dim, H), nn.LayerNorm(H), nn.GELU(), nn.Dropout(0.5),
                _wn(nn.Linear(H, H)), nn.LayerNorm(H), nn.GELU(), nn.Dropout(0.4),
                _wn(nn.Linear(H, H)), nn.LayerNorm(H), nn.GELU(), nn.Dropout(0.4),
                _wn(nn.Linear(H, H // 2)), nn.LayerNorm(H // 2), nn.GELU(), nn.Dropout(0.3),
                nn.Linear(H // 2, 1))
            self.image_proj = nn.Sequential(nn.Linear(image_dim, H), nn.LayerNorm(H), nn.ReLU(), nn.Dropout(0.3))
            self.text_proj = nn.Sequential(nn.Linear(text_dim, H), nn.LayerNorm(H), nn.ReLU(), nn.Dropout(0.3))
            self.img2txt = nn.MultiheadAttention(H, heads, dropout=0.3, batch_first=True)
            self.txt2img = nn.MultiheadAttention(H, heads, dropout=0.3, batch_first=True)
            blocks: list[nn.Module] = [nn.Dropout(0.5)]
            d = 2 * H
            for _ in range(3):
                blocks += [nn.Linear(d, H), nn.LayerNorm(H), nn.ReLU(), nn.Dropout(0.5)]
                d = H
            blocks.append(nn.Linear(H, 1))
            self.head = nn.Sequential(*blocks)
            self.log_vars = nn.Parameter(torch.zeros(3))
            for m in self.modules():
                if isinstance(m, nn.Linear) and not hasattr(m, "parametrizations"):
                    nn.init.xavier_uniform_(m.weight)
                    nn.init.zeros_(m.bias)

        def forward(self, img, caps, cap_mask, cap_emb=None, img_emb=None, relevance: bool = True,
                    tau: float = 1.0, hard: bool = True, modality: str = "both"):
            """img [B, Di]; caps [B, K, Dt]; cap_mask [B, K] bool; cap_emb/img_emb: the backbone's
            projected embeddings (cosine selection when the relevance scorer is off)."""
            import torch.nn.functional as F
            if modality == "text":
                img = torch.zeros_like(img)
            B, K, _ = caps.shape
            scorer_in = torch.cat([img.unsqueeze(1).expand(B, K, -1), caps], -1)
            scores = self.caption_scorer(scorer_in).squeeze(-1)                   # [B, K]
            if relevance or cap_emb is None:
                sel_logits = scores
            else:
                sel_logits = (F.normalize(img_emb, dim=-1).unsqueeze(1) * F.normalize(cap_emb, dim=-1)).sum(-1) / 0.07
            sel_logits = sel_logits.masked_fill(~cap_mask, -1e4)
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
            return {"logit": logit, "scores": scores, "weights": weights, "img_proj": ip, "txt_proj": tp}

    return _CLIPClassifier()


#: The TRACE classifier (a torch module built for the backbone's feature widths).
CLIPClassifier = build_classifier


# ----------------------------------------------------------------------------- losses
def focal_bce(logit, target, alpha: float = 0.25, gamma: float = 2.0, focal_weight: float = 0.9):
    """0.9 focal (alpha on positives, gamma 2) + 0.1 BCE, on logits."""
    import torch
    import torch.nn.functional as F
    bce = F.binary_cross_entropy_with_logits(logit, target, reduction="none")
    p = torch.sigmoid(logit)
    pt = torch.where(target > 0.5, p, 1 - p)
    at = torch.where(target > 0.5, torch.full_like(p, alpha), torch.full_like(p, 1 - alpha))
    focal = at * (1 - pt) ** gamma * bce
    return focal_weight * focal.mean() + (1 - focal_weight) * bce.mean()


def info_nce(a, b, tau: float = 0.07):
    import torch
    import torch.nn.functional as F
    a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    logits = a @ b.T / tau
    t = torch.arange(len(a), device=a.device)
    return 0.5 * (F.cross_entropy(logits, t) + F.cross_entropy(logits.T, t))


def sigmoid_contrastive(a, b, t: float = 10.0, bias: float = -10.0):
    """SigLIP's pairwise sigmoid loss."""
    import torch
    import torch.nn.functional as F
    a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    logits = a @ b.T * t + bias
    labels = 2 * torch.eye(len(a), device=a.device) - 1
    return -F.logsigmoid(labels * logits).sum() / len(a)


def trace_loss(out: dict[str, Any], labels, cap_mask, enabled: Sequence[str], log_vars=None,
               fixed_weights: dict[str, float] | None = None, sigmoid: bool = False) -> tuple[Any, dict[str, float]]:
    """The enabled losses combined by uncertainty weighting sum_k exp(-s_k) L_k + 0.5 s_k (or fixed weights)."""
    parts = {}
    if "cls" in enabled:
        parts["cls"] = focal_bce(out["logit"], labels)
    if "rel" in enabled:
        m = cap_mask.float()
        mean_score = (out["scores"] * m).sum(-1) / m.sum(-1).clamp(min=1)
        parts["rel"] = focal_bce(mean_score, labels)
    if "con" in enabled and len(labels) > 1:
        fn = sigmoid_contrastive if sigmoid else info_nce
        parts["con"] = fn(out["img_proj"], out["txt_proj"])
    total = 0.0
    for k, v in parts.items():
        if fixed_weights is not None:
            total = total + fixed_weights.get(k, 0.0) * v
        else:
            s = log_vars[LOSSES.index(k)]
            total = total + (-s).exp() * v + 0.5 * s
    return total, {k: float(v.detach()) for k, v in parts.items()}


def gumbel_tau(epoch: int, epochs: int) -> float:
    """tau = max(1 - 0.9 e / E, 0.1) at epoch e of E (0-based)."""
    return max(1.0 - 0.9 * epoch / max(1, epochs), 0.1)


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
                 progress: bool = True, store_dtype: str = "float32"):
        import torch
        from PIL import Image
        from tqdm.auto import tqdm
        if store_dtype not in CACHE_DTYPES:
            raise ValueError(f"FeatureCache: store_dtype must be one of {', '.join(CACHE_DTYPES)}, not {store_dtype!r}")
        store = getattr(torch, store_dtype)
        self.layer = lowest_unfrozen
        feats, embs = [], []
        with torch.no_grad():
            for k in tqdm(range(0, len(data.image_paths), batch_size), desc="cache image features",
                          disable=not progress):
                ims = [Image.open(p).convert("RGB") for p in data.image_paths[k:k + batch_size]]
                f = encoder.image_features(ims)
                feats.append(f.float().cpu())
                embs.append(encoder.project_image(f).float().cpu())
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
    import torch
    idx = torch.as_tensor(text_idx)
    if cache is not None:
        h, t = cache.text_inputs(idx)
        f = encoder.text_features_from(h.to(encoder.device), t, cache.layer)
    else:
        f = encoder.text_features([data.texts[i] for i in idx.tolist()])
    return f, encoder.project_text(f)


def batch_features(encoder, data: MemeBatchData, rows, cache: FeatureCache | None):
    """Image features/embeddings, candidate caption features [B, K, D] and mask for meme rows."""
    import torch
    from PIL import Image
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
    loss_config: str = "cls+rel"          # cls+rel (default) | cls+con | all
    modality: str = "both"                # both | text | image (unimodal baselines)
    unfreeze_text_layers: tuple[int, ...] = (-1,)   # relative to the last text layer (-1 = last)
    lora_rank: int = 0                    # > 0: LoRA (peft) on the unfrozen layers' attention instead of full tuning
    hidden: int = 1024
    epochs: int = 30
    batch_size: int = 128
    grad_accum: int = 4                   # effective batch = batch_size * grad_accum
    lr: float = 1e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    patience: int = 5                     # early stopping on validation AUROC (or macro-F1)
    lr_patience: int = 2                  # ReduceLROnPlateau(max, factor 0.1)
    select_on: str = "auroc"              # auroc | macro_f1 (MultiOFF)
    fixed_weights: dict[str, float] | None = None   # MultiOFF: {"cls": 1, "con": 0.3, "rel": 0.7}
    sigmoid_contrastive: bool = False     # SigLIP backbones
    cache_frozen: bool = True
    cache_dtype: str = "float32"          # host dtype of cached text hidden states (float16/bfloat16 halve memory)
    amp: bool = True                      # autocast bf16/fp16 on GPU; ignored on CPU
    seed: int = 121
    deterministic: bool = True            # torch deterministic algorithms (warn-only): the same run twice gives
                                          # the same numbers (without it, 1e-7 differences in accumulated
                                          # gradients grow into different models over 12 epochs)


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
        from peft import LoraConfig, inject_adapter_in_model
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
    import torch.nn as nn
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


def metrics_at(probs: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support, roc_auc_score
    pred = (probs >= threshold).astype(int)
    p, r, f, _ = precision_recall_fscore_support(labels, pred, average="macro", zero_division=0)
    auroc = roc_auc_score(labels, probs) if len(set(labels.tolist())) == 2 else float("nan")
    return {"accuracy": float(accuracy_score(labels, pred)), "macro_precision": float(p), "macro_recall": float(r),
            "macro_f1": float(f), "auroc": float(auroc)}


def best_threshold(probs: np.ndarray, labels: np.ndarray, by: str = "accuracy") -> float:
    """The threshold that maximises `by` on these (validation) predictions."""
    cands = np.unique(np.concatenate([[0.5], probs]))
    scores = [metrics_at(probs, labels, t)[by] for t in cands]
    return float(cands[int(np.argmax(scores))])


class Trainer:
    """Fine-tunes `CLIPClassifier` (+ the unfrozen text layers) on MemeBatchData."""

    def __init__(self, encoder, data: MemeBatchData, cfg: TrainConfig, cache: FeatureCache | None = None,
                 progress: bool = True, accelerator=None):
        """accelerator: an `accelerate.Accelerator` for multi-process (multi-GPU) training: every process
        takes its share of each epoch's batches and gradients are averaged over processes before each
        optimizer step, so all processes hold the same weights (the encoder must already be on
        `accelerator.device`)."""
        import torch
        self.encoder, self.data, self.cfg, self.progress = encoder, data, cfg, progress
        self.acc = accelerator
        self.world = accelerator.num_processes if accelerator is not None else 1
        self.rank = accelerator.process_index if accelerator is not None else 0
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            if torch.cuda.is_available() and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
                import warnings
                warnings.warn("deterministic training on a GPU needs CUBLAS_WORKSPACE_CONFIG=:4096:8 set before "
                              "the first cuBLAS call (import lib.trace first, or export it)")
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.unfrozen = set_trainable(encoder, cfg)
        if cfg.cache_frozen and cache is not None and cache.layer > min(self.unfrozen):
            raise ValueError(f"feature cache stops at layer {cache.layer} but layer {min(self.unfrozen)} is unfrozen")
        self.cache = cache if cfg.cache_frozen else None
        self.model = build_classifier(encoder.image_dim, encoder.text_dim, cfg.hidden).to(encoder.device)
        self.enabled = LOSS_CONFIGS[cfg.loss_config]
        self.relevance = "rel" in self.enabled
        params = [p for p in self.model.parameters()] + [p for p in encoder.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.ReduceLROnPlateau(self.opt, mode="max", factor=0.1,
                                                                patience=cfg.lr_patience)
        self.curve: list[dict[str, Any]] = []
        self._params = params

    def _forward(self, rows, train: bool, tau: float = 1.0):
        import torch
        img, img_emb, caps, cemb, mask = batch_features(self.encoder, self.data, rows, self.cache)
        dev = self.encoder.device
        use_amp = self.cfg.amp and dev.startswith("cuda")
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=use_amp):
            out = self.model(img.float(), caps.float(), mask, cemb.float(), img_emb.float(), relevance=self.relevance,
                             tau=tau, hard=True, modality=self.cfg.modality)
        return out, mask

    def epoch(self, rows: np.ndarray, epoch: int) -> dict[str, float]:
        import torch
        from tqdm.auto import tqdm
        cfg = self.cfg
        self.model.train()
        self.encoder.model.train()
        perm = np.random.permutation(rows)            # the same on every process (same seed)
        tau = gumbel_tau(epoch, cfg.epochs)
        t0, losses = time.time(), []
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
                                     cfg.sigmoid_contrastive)
            (scale * loss / cfg.grad_accum).backward()
            if (b + 1) % cfg.grad_accum == 0 or b + 1 == n_batches:
                self._sync_gradients()
                torch.nn.utils.clip_grad_norm_(self._params, cfg.grad_clip)
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        return {"loss": float(np.mean(losses)), "seconds": time.time() - t0, "tau": tau}

    def _sync_gradients(self) -> None:
        """Average gradients over processes (what DDP does), one flat all-reduce per step."""
        if self.world <= 1:
            return
        import torch
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
        import torch
        self.model.eval()
        self.encoder.model.eval()
        probs, weights = [], []
        with torch.no_grad():
            for k in range(0, len(rows), batch_size):
                out, _ = self._forward(rows[k:k + batch_size], False)
                probs.append(torch.sigmoid(out["logit"]).float().cpu().numpy())
                weights.append(out["weights"].float().cpu().numpy())
        return np.concatenate(probs), np.concatenate(weights)

    def fit(self, train_rows, val_rows) -> dict[str, Any]:
        """Train with ReduceLROnPlateau and early stopping on validation; keep the best state."""
        import torch
        cfg = self.cfg
        best, best_state, bad = -1.0, None, 0
        for e in range(cfg.epochs):
            ep = self.epoch(np.asarray(train_rows), e)
            pv, _ = self.predict(np.asarray(val_rows))
            yv = self.data.labels[np.asarray(val_rows)].astype(int)
            vm = metrics_at(pv, yv, best_threshold(pv, yv))
            score = vm[cfg.select_on]
            self.sched.step(score)
            self.curve.append({"epoch": e + 1, **ep, "val_auroc": vm["auroc"], "val_macro_f1": vm["macro_f1"],
                               "lr": self.opt.param_groups[0]["lr"]})
            if score > best + 1e-6:
                best, bad = score, 0
                best_state = (copy.deepcopy(self.model.state_dict()),
                              {n: p.detach().clone() for n, p in self.encoder.model.named_parameters() if p.requires_grad})
            else:
                bad += 1
                if bad >= cfg.patience:
                    break
        if best_state is not None:
            self.model.load_state_dict(best_state[0])
            named = dict(self.encoder.model.named_parameters())
            with torch.no_grad():
                for n, v in best_state[1].items():
                    named[n].copy_(v)
        return {"best_val": best, "epochs_run": len(self.curve)}

    def evaluate(self, val_rows, test_splits: dict[str, np.ndarray]) -> dict[str, Any]:
        """Threshold from validation only; per-split metrics, the optimistic (threshold-on-test) variant
        labelled as such, and predictions (id, probability, threshold, prediction, label)."""
        pv, _ = self.predict(np.asarray(val_rows))
        yv = self.data.labels[np.asarray(val_rows)].astype(int)
        thr = best_threshold(pv, yv)
        out: dict[str, Any] = {"threshold": thr, "val": metrics_at(pv, yv, thr), "splits": {}, "predictions": []}
        for split, rows in test_splits.items():
            rows = np.asarray(rows)
            p, w = self.predict(rows)
            y = self.data.labels[rows].astype(int)
            m = metrics_at(p, y, thr)
            m["accuracy_optimistic_threshold_on_test"] = metrics_at(p, y, best_threshold(p, y))["accuracy"]
            out["splits"][split] = m
            for i, r in enumerate(rows):
                out["predictions"].append({"id": self.data.ids[r], "split": split, "probability": float(p[i]),
                                           "threshold": thr, "prediction": int(p[i] >= thr), "label": int(y[i]),
                                           "selected": self.data.columns[int(np.argmax(w[i]))]})
        return out


def per_type_accuracy(predictions: list[dict[str, Any]], types: dict[str, str]) -> dict[str, float]:
    import collections
    hit: dict[str, list[int]] = collections.defaultdict(list)
    for p in predictions:
        t = types.get(p["id"])
        if t is not None:
            hit[t].append(int(p["prediction"] == p["label"]))
    return {t: float(np.mean(v)) for t, v in sorted(hit.items())}


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> dict[str, float]:
    """McNemar on paired correct/incorrect (statsmodels, exact=False, correction=True)."""
    from statsmodels.stats.contingency_tables import mcnemar as _mc
    a, b = np.asarray(correct_a, bool), np.asarray(correct_b, bool)
    table = [[int((a & b).sum()), int((a & ~b).sum())], [int((~a & b).sum()), int((~a & ~b).sum())]]
    r = _mc(table, exact=False, correction=True)
    return {"statistic": float(r.statistic), "pvalue": float(r.pvalue), "b": table[0][1], "c": table[1][0]}


# ----------------------------------------------------------------------------- runs (notebook 02 and the CLI)
VALIDATION_SPLITS = ("dev_seen", "dev_unseen", "val")
TEST_SPLITS = ("test_seen", "test_unseen", "test")
MULTIOFF_RECIPE = {"loss_config": "all", "fixed_weights": {"cls": 1.0, "con": 0.3, "rel": 0.7},
                   "select_on": "macro_f1", "unfreeze_text_layers": (-1,), "batch_size": 32, "grad_accum": 4,
                   "epochs": 20, "seed": 42}


def run_config(section: dict[str, Any], backbone: str | None = None, dataset: str = "fhm",
               **overrides) -> tuple[str, TrainConfig]:
    """The backbone and TrainConfig of one run from a profile's `02_finetuning` section (notebook
    02's parameters): the section's TrainConfig fields, then for FHM the backbone's `recipes` entry,
    for MultiOFF `MULTIOFF_RECIPE` updated by the section's `multioff` (whose `backbone` is the
    default encoder there), then `overrides`. The backbone defaults to the section's first."""
    fields = TrainConfig.__dataclass_fields__
    first = (section.get("backbones") or ["memeworld-clip"])[0]
    if dataset == "multioff":
        recipe = {**MULTIOFF_RECIPE, **(section.get("multioff") or {})}
        default = recipe.pop("backbone", first)
        backbone = backbone or default
    else:
        backbone = backbone or first
        recipe = dict((section.get("recipes") or {}).get(backbone, {}))
    unknown = sorted(set(recipe) - set(fields))
    if unknown:
        where = "multioff" if dataset == "multioff" else f"recipes.{backbone}"
        raise ValueError(f"02_finetuning.{where}: unknown key(s) {', '.join(unknown)} (TrainConfig fields: "
                         f"{', '.join(sorted(fields))})")
    kw = {**{k: v for k, v in section.items() if k in fields}, **recipe, **overrides}
    kw["unfreeze_text_layers"] = tuple(kw.get("unfreeze_text_layers", (-1,)))
    return backbone, TrainConfig(**kw)


def split_rows(data: MemeBatchData) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """train rows, validation rows (dev_seen + dev_unseen, or MultiOFF's val) and each test split's rows."""
    sp = np.array(data.splits)
    tests = {s: np.where(sp == s)[0] for s in TEST_SPLITS if (sp == s).any()}
    return np.where(sp == "train")[0], np.where(np.isin(sp, VALIDATION_SPLITS))[0], tests


def load_trace_data(path, columns: Sequence[str]) -> MemeBatchData:
    """A TRACE JSON file (notebook 01's output) as MemeBatchData over the meme text + `columns`."""
    from pathlib import Path
    from lib import datasets
    path = Path(path)
    # notebook 01 writes absolute image paths into its TRACE JSON (the compendium's own artifact)
    ds = datasets.load("trace", path.parent, file=path.name, image_root="/", caption_columns=None,
                       allow_outside_images=True)
    return MemeBatchData.from_records(ds.records, list(columns))


def lowest_layer(encoder, unfreeze_text_layers: Sequence[int]) -> int:
    """The lowest unfrozen text layer: where `FeatureCache` stops."""
    return unfrozen_layer_indices(encoder, unfreeze_text_layers)[0]


def train_variant(encoder, data: MemeBatchData, cfg: TrainConfig, cache: FeatureCache | None = None,
                  progress: bool = True, accelerator=None) -> dict[str, Any]:
    """Fit with validation-based selection, then evaluate every test split at the validation threshold."""
    train, val, tests = split_rows(data)
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"TRACE data has {len(train)} train and {len(val)} validation memes; both are needed "
                         f"(validation splits: {', '.join(VALIDATION_SPLITS)})")
    t0 = time.time()
    tr = Trainer(encoder, data, cfg, cache, progress=progress, accelerator=accelerator)
    fit = tr.fit(train, val)
    ev = tr.evaluate(val, tests)
    return {"fit": fit, "curve": tr.curve, "eval": ev, "seconds": time.time() - t0, "trainer": tr}


def main(argv: Sequence[str] | None = None) -> int:
    """Train one TRACE variant from a profile, single- or multi-process:

        python -m lib.trace --profile paper --backbone clip-vit-l14 --loss-config cls+rel
        accelerate launch --multi_gpu --num_processes 4 -m lib.trace --profile paper --dataset multioff

    Reads the profile's `02_finetuning` section (and its `recipes` / `multioff` entries), the TRACE
    JSON from notebook 01, and writes metrics.json, predictions.csv and curve.json under
    artifacts/<profile>/02_finetuning/runs/<dataset>_<backbone>_<variant>/ (main process only)."""
    import argparse
    import pandas as pd
    from lib.artifacts import require, stage_dir, write_json, write_text
    from lib.encoders import load_encoder
    from lib.params import load_profile
    ap = argparse.ArgumentParser(prog="python -m lib.trace", description=main.__doc__.split("\n")[0])
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--dataset", choices=("fhm", "multioff"), default="fhm")
    ap.add_argument("--backbone", help="encoder preset (default: the profile's first backbone)")
    ap.add_argument("--loss-config", choices=sorted(LOSS_CONFIGS))
    ap.add_argument("--modality", choices=("both", "text", "image"), default="both")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--cache-dtype", choices=CACHE_DTYPES,
                    help="host dtype of the cached text hidden states (default float32, exact)")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    p = load_profile(a.profile).get("02_finetuning", {})
    acc = None
    try:
        from accelerate import Accelerator
        acc = Accelerator(mixed_precision="no")      # AMP is the Trainer's own autocast
    except ImportError:
        pass
    device = str(acc.device) if acc is not None else p.get("device")
    given = {"loss_config": a.loss_config, "epochs": a.epochs, "cache_dtype": a.cache_dtype}
    backbone, cfg = run_config(p, a.backbone, a.dataset, modality=a.modality,
                               **{k: v for k, v in given.items() if v})
    src = require(a.profile, "trace_captions_multioff" if a.dataset == "multioff" else "trace_captions",
                  "python -m lib.trace")
    data = load_trace_data(src, p.get("caption_columns", []))
    enc = load_encoder(backbone, device=device)
    cache = FeatureCache(enc, data, lowest_layer(enc, cfg.unfreeze_text_layers),
                         progress=not a.no_progress, store_dtype=cfg.cache_dtype) if cfg.cache_frozen else None
    if cache is not None:
        print(f"feature cache: {cache.nbytes / 2**30:.2f} GiB ({cfg.cache_dtype} hidden states)")
    r = train_variant(enc, data, cfg, cache, progress=not a.no_progress, accelerator=acc)
    if acc is None or acc.is_main_process:
        name = f"{a.dataset}_{backbone}_{cfg.loss_config.replace('+', '_')}" + ("" if a.modality == "both" else f"_{a.modality}_only")
        out = stage_dir(a.profile, "02_finetuning") / "runs" / name
        out.mkdir(parents=True, exist_ok=True)
        flat = {"threshold": r["eval"]["threshold"], "processes": acc.num_processes if acc else 1,
                "seconds": r["seconds"], **{f"{s}_{k}": v for s, m in r["eval"]["splits"].items() for k, v in m.items()}}
        write_json(out / "metrics.json", flat)
        write_json(out / "curve.json", r["curve"])
        write_text(out / "predictions.csv", pd.DataFrame(r["eval"]["predictions"]).to_csv(index=False))
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in flat.items() if isinstance(v, float)))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
