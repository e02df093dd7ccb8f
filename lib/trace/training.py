"""TRACE's training loop: `Trainer` fine-tunes `CLIPClassifier` and the unfrozen text layers with
the combined loss, early stopping on validation, best-epoch restore, resumable checkpoints (read with
torch's weights-only loader), one or several processes (`accelerate`).
"""
from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import asdict
from typing import Any
import random
import warnings
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from lib.compendium.artifacts import write_with
from lib.evaluation.metrics import best_threshold, metrics_at, pr_best_f1_threshold
from lib.trace.features import FeatureCache, MemeBatchData, batch_features
from lib.trace.model import (LOSS_CONFIGS, TrainConfig, _embed_dims, allowed_columns, build_classifier, gumbel_tau,
                             head_final_dropout, head_inputs, set_trainable, trace_loss)


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
                              "the first cuBLAS call (import lib.trace.model first, or export it)")
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
