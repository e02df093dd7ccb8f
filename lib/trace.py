"""TRACE: hateful-meme detection by fine-tuning a CLIP-family encoder with caption relevance.

Each meme has several candidate captions (the meme text itself plus one per captioning
model). `CLIPClassifier` scores every candidate with a caption-relevance scorer, selects one
by Gumbel-softmax while training (softmax at inference), projects the image and the selected
caption, lets them attend to each other (bidirectional cross-attention) and classifies.
Losses: classification (0.9 focal + 0.1 BCE), relevance (the same loss on the mean scorer
logit over valid captions) and contrastive (InfoNCE, or sigmoid for SigLIP), combined with
learned uncertainty weights or fixed weights (MultiOFF recipe).

The backbone is frozen except selected text layers. Frozen parts are computed once: image
features for every meme and the text hidden states entering the lowest unfrozen layer for
every distinct caption (`FeatureCache`); training then runs only the unfrozen layers and the
classifier. `features(..., cached=False)` runs the full backbone and gives the same numbers.

Evaluation is honest: the decision threshold is chosen on validation only; the official
code's threshold-tuned-on-test number can be computed beside it, labelled optimistic.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

LOSSES = ("cls", "rel", "con")
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
    text hidden states entering the lowest unfrozen layer per distinct caption."""

    def __init__(self, encoder, data: MemeBatchData, lowest_unfrozen: int, batch_size: int = 128,
                 progress: bool = True):
        import torch
        from PIL import Image
        from tqdm.auto import tqdm
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
            self.input_ids, self.attention_mask = tok["input_ids"], tok["attention_mask"]
            hs = []
            for k in tqdm(range(0, len(data.texts), batch_size), desc="cache text hidden states",
                          disable=not progress):
                t = {"input_ids": self.input_ids[k:k + batch_size], "attention_mask": self.attention_mask[k:k + batch_size]}
                hs.append(encoder.text_hidden_below(t, self.layer).float().cpu())
            self.hidden = torch.cat(hs)


def text_features(encoder, data: MemeBatchData, text_idx, cache: FeatureCache | None, tokens=None):
    """Pooled (pre-projection) features and projected embeddings for the distinct texts `text_idx`."""
    import torch
    idx = torch.as_tensor(text_idx)
    if cache is not None:
        L = int(cache.attention_mask[idx].sum(1).max())
        t = {"input_ids": cache.input_ids[idx, :L], "attention_mask": cache.attention_mask[idx, :L]}
        f = encoder.text_features_from(cache.hidden[idx, :L].to(encoder.device), t, cache.layer)
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
    amp: bool = True                      # autocast bf16/fp16 on GPU; ignored on CPU
    seed: int = 121


def set_trainable(encoder, cfg: TrainConfig) -> list[int]:
    """Freeze the backbone except the chosen text layers (or LoRA adapters on them); return their indices."""
    layers = encoder.text_layers()
    n = len(layers)
    idx = sorted({(n + i) if i < 0 else i for i in cfg.unfreeze_text_layers})
    for p in encoder.model.parameters():
        p.requires_grad_(False)
    if cfg.lora_rank > 0:
        from peft import LoraConfig, inject_adapter_in_model
        targets = [f"text_model.encoder.layers.{i}.self_attn.{m}" for i in idx for m in ("q_proj", "v_proj")]
        inject_adapter_in_model(LoraConfig(r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, target_modules=targets),
                                encoder.model)
        for name, p in encoder.model.named_parameters():
            p.requires_grad_("lora_" in name)
    else:
        for i in idx:
            for p in layers[i].parameters():
                p.requires_grad_(True)
    return idx


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
                 progress: bool = True):
        import torch
        self.encoder, self.data, self.cfg, self.progress = encoder, data, cfg, progress
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
        perm = np.random.permutation(rows)
        tau = gumbel_tau(epoch, cfg.epochs)
        t0, losses = time.time(), []
        self.opt.zero_grad(set_to_none=True)
        n_batches = math.ceil(len(perm) / cfg.batch_size)
        for b in tqdm(range(n_batches), desc=f"epoch {epoch + 1}", disable=not self.progress, leave=False):
            r = perm[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            out, mask = self._forward(r, True, tau)
            y = torch.as_tensor(self.data.labels[r], device=out["logit"].device)
            loss, parts = trace_loss(out, y, mask, self.enabled, self.model.log_vars, cfg.fixed_weights,
                                     cfg.sigmoid_contrastive)
            (loss / cfg.grad_accum).backward()
            if (b + 1) % cfg.grad_accum == 0 or b + 1 == n_batches:
                torch.nn.utils.clip_grad_norm_(self._params, cfg.grad_clip)
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        return {"loss": float(np.mean(losses)), "seconds": time.time() - t0, "tau": tau}

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
