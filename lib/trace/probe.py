"""TRACE's precondition, checked on the components alone: do the captions carry what the classifier's encoder
cannot read? Linear probes (logistic regression) on the frozen encoder's embeddings, fitted on the train split
and scored on a test split: the encoder's view without captions (the image and the meme text, as TRACE's model
without captions sees them) against the same view with each caption column's text embedding added. A caption
that adds nothing a linear read-out of the encoder lacks leaves caption selection nothing to find; a caption that
states what the generator knows (the `cue` source of lib.trace.controls) should add a great deal.

    feats = embed_sources("memeworld-clip", recs, ["vlm_caption", "tag_caption"], out_dir / "probe_embeddings.npz")
    table, gains, items = probe_table(feats, recs, {"label": labels, "interaction type": types})
    metrics = probe_metrics(items.assign(captions="captions"))      # probe_captions_label_gain, ...

Two targets: the label (what the claim is about) and MemeWorld's interaction type (the interplay itself).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from lib.compendium.artifacts import atomic_path
from lib.models.encoders import encoder_identity, load_encoder
from lib.evaluation.metrics import paired_accuracy_test


class ProbeError(ValueError):
    """A probe that cannot be fitted; the message names the file, record and field."""


def embed_sources(encoder: str, recs: Sequence[dict[str, Any]], columns: Sequence[str], cache_file: str | Path,
                  batch_size: int = 128) -> dict[str, np.ndarray]:
    """L2-normalised embeddings of each record's image ("image"), meme text ("text") and caption `columns`
    (one array each, rows in `recs` order; a column a record lacks embeds as empty text), cached in `cache_file` keyed by the encoder, the images' files and
    every text embedded: a rerun on the same inputs embeds nothing."""
    import torch
    for k, r in enumerate(recs):                      # a missing caption column reads as empty, as TRACE's loader reads it
        for field in ("id", "img", "text"):
            if field not in r:
                raise ProbeError(f"embed_sources: record {k} (id {r.get('id')!r}) has no field {field!r}")
    sig = [[encoder, list(columns), encoder_identity(encoder)]] + [[str(r["id"]), Path(r["img"]).name, Path(r["img"]).stat().st_size,
                                         str(r["text"]), *[str(r.get(c) or "") for c in columns]] for r in recs]
    key = hashlib.sha256(json.dumps(sig).encode()).hexdigest()[:20]
    cache_file = Path(cache_file)
    if cache_file.exists():
        z = np.load(cache_file, allow_pickle=False)
        if str(z["key"]) == key:
            return {k: z[k] for k in ("image", "text", *columns)}
    enc = load_encoder(encoder)

    def run(fn, items):
        out = []
        for k in range(0, len(items), batch_size):
            with torch.no_grad():
                out.append(fn(items[k:k + batch_size]).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)

    feats = {"image": run(lambda ch: enc.encode_images([Image.open(r["img"]).convert("RGB") for r in ch]), list(recs)),
             "text": run(lambda ch: enc.encode_texts([str(r["text"]) for r in ch]), list(recs))}
    for c in columns:
        feats[c] = run(lambda ch, c=c: enc.encode_texts([str(r.get(c) or "") for r in ch]), list(recs))
    with atomic_path(cache_file) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, key=np.array(key), **feats)
    return feats


def _probe(x_train: np.ndarray, y_train: Sequence[str], x_test: np.ndarray, seed: int = 0) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression
    return LogisticRegression(max_iter=2000, random_state=seed).fit(x_train, list(y_train)).predict(x_test)


def probe_table(feats: dict[str, np.ndarray], recs: Sequence[dict[str, Any]], targets: dict[str, dict[str, Any]],
                columns: Sequence[str] | None = None, train_split: str = "train", test_split: str = "test_seen",
                seed: int = 0, confidence: float = 0.95):
    """For each target (name -> meme id -> class), the probe's test accuracy on the encoder's view ("image +
    meme text") and on that view with the caption `columns` added ("+ captions"), and their paired difference
    (exact McNemar, a bootstrap interval over memes: lib.evaluation.metrics.paired_accuracy_test). Returns
    (the table, {target: that test's result}, the per-meme frame: target, features, id, correct)."""
    import pandas as pd
    columns = [c for c in (columns or [k for k in feats if k not in ("image", "text")])]
    split = np.array([str(r.get("split")) for r in recs])
    tr, te = split == train_split, split == test_split
    if not tr.any() or not te.any():
        raise ProbeError(f"probe_table: no memes of split {train_split!r} or {test_split!r} to fit and score on")
    ids = [str(r["id"]) for r in recs]
    views = {"image + meme text": np.hstack([feats["image"], feats["text"]])}
    views["image + meme text + captions"] = np.hstack([views["image + meme text"], *[feats[c] for c in columns]])
    rows, gains, items = [], {}, []
    for target, cls in targets.items():
        missing = [i for i, ok in zip(ids, tr | te) if ok and i not in cls]
        if missing:
            raise ProbeError(f"probe_table: target {target!r} has no class for meme {missing[0]!r}")
        y = np.array([str(cls.get(i)) for i in ids])
        right = {}
        for view, x in views.items():
            pred = _probe(x[tr], y[tr], x[te], seed)
            right[view] = {i: bool(p == t) for i, p, t in zip(np.array(ids)[te], pred, y[te])}
            items += [{"target": target, "features": view, "id": i, "correct": ok} for i, ok in right[view].items()]
            rows.append({"target": target, "features": view, "accuracy": round(float(np.mean(pred == y[te])), 3),
                         "n": int(te.sum()), "classes": len(set(y[tr])), "95% CI": "", "p": ""})
        gains[target] = test = _gain(right, confidence)
        rows.append({"target": target, "features": "gain from the captions", "accuracy": round(test["difference"], 3),
                     "n": test["n"], "classes": len(set(y[tr])),
                     "95% CI": f"[{test['ci_difference'][0]:.3f}, {test['ci_difference'][1]:.3f}]",
                     "p": float(f"{test['p']:.3g}")})
    return pd.DataFrame(rows), gains, pd.DataFrame(items)


def _gain(right: dict[str, dict[str, bool]], confidence: float = 0.95) -> dict[str, Any]:
    with_captions, without = right["image + meme text + captions"], right["image + meme text"]
    return paired_accuracy_test(with_captions, without, {i: 0 for i in without}, confidence)


def probe_metrics(items, confidence: float = 0.95) -> dict[str, float]:
    """metrics.json keys from the per-meme probe frame (probe_table's third value, with a `captions` column
    naming the caption source): probe_<captions>_<target>_gain, _ci_low, _ci_high, _p, _n, each the paired test
    of the view with captions against the view without (so the committed per-meme file recomputes them)."""
    out, gains = {}, {}
    for (source, target), g in items.groupby(["captions", "target"], sort=False):
        right = {view: {str(i): str(c) == "True" for i, c in zip(v["id"], v["correct"])}
                 for view, v in g.groupby("features", sort=False)}
        gains[f"{source}_{target}"] = _gain(right, confidence)
    for name, t in gains.items():
        k = f"probe_{name.replace(' ', '_')}"
        out.update({f"{k}_gain": round(float(t["difference"]), 6), f"{k}_ci_low": round(float(t["ci_difference"][0]), 6),
                    f"{k}_ci_high": round(float(t["ci_difference"][1]), 6), f"{k}_p": float(t["p"]), f"{k}_n": int(t["n"])})
    return out
