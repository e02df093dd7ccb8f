"""Exemplar retrieval for few-shot prompting: meme embeddings (the image, or the image with its text)
cached per file list, the top n training memes per query, how often they share the query's label or type, and the k-nearest-neighbour vote
(the retriever alone, as a baseline).
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from lib.compendium.artifacts import atomic_path
from lib.models.encoders import encoder_identity, load_encoder
from lib.sei.fewshot import Meme


# ----------------------------------------------------------------------------- retrieval
#: a retriever named "<encoder>+text" reads the picture together with the meme's own text: each meme's
#: vector is its image embedding and the embedding of its text, each L2-normalised, side by side and scaled
#: to unit length, so that the cosine of two memes is the mean of their image cosine and their text cosine
#: (a named option of the embedded profile: MemeWorld's labels live in how the text and the picture combine,
#: which an image-only neighbour cannot share; SigLIP, the paper's retriever, reads the picture with its text)
TEXT_SUFFIX = "+text"


def split_retriever(retriever: str) -> tuple[str, bool]:
    """(the encoder preset or folder, whether the meme's text is embedded beside its picture)."""
    if retriever.endswith(TEXT_SUFFIX):
        return retriever[: -len(TEXT_SUFFIX)], True
    return retriever, False


def embed_memes(retriever: str, memes: Sequence[Meme], cache_file: str | Path, batch_size: int = 64,
                progress: bool = True) -> dict[str, np.ndarray]:
    """L2-normalised embeddings per meme id (its image; with "+text", its image and its text: TEXT_SUFFIX),
    cached in an .npz keyed by the encoder's identity, the retriever and the memes (image name and size, and
    the text where it is embedded); only missing ids are computed."""
    import torch
    encoder, with_text = split_retriever(retriever)
    ident = encoder_identity(encoder)                   # weights and the backend's code (a local folder too)
    key = hashlib.sha256(json.dumps([ident, with_text], sort_keys=True, default=str).encode()).hexdigest()[:16]
    cache_file = Path(cache_file)
    have: dict[str, np.ndarray] = {}
    if cache_file.exists():
        z = np.load(cache_file, allow_pickle=False)
        if str(z["key"]) == key:
            have = {i: v for i, v in zip(z["ids"].tolist(), z["emb"])}
    sig = {m.id: f"{m.id}|{Path(m.img_path).name}|{Path(m.img_path).stat().st_size}"
           + (f"|{hashlib.sha256(m.ocr.encode()).hexdigest()[:12]}" if with_text else "") for m in memes}
    todo = [m for m in memes if sig[m.id] not in have]
    if todo:
        enc = load_encoder(encoder)
        bar = tqdm(total=len(todo), desc=f"embed memes ({retriever})", disable=not progress)
        for k in range(0, len(todo), batch_size):
            chunk = todo[k:k + batch_size]
            ims = [Image.open(m.img_path).convert("RGB") for m in chunk]
            with torch.no_grad():
                e = enc.encode_images(ims).float().cpu().numpy()
                if with_text:
                    t = enc.encode_texts([m.ocr for m in chunk]).float().cpu().numpy()
                    e = np.concatenate([e, t], axis=1) / np.sqrt(2.0)
            for m, v in zip(chunk, e):
                have[sig[m.id]] = v
            bar.update(len(chunk))
        bar.close()
        ids = sorted(have)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(cache_file) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, key=np.array(key), ids=np.array(ids), emb=np.stack([have[i] for i in ids]))
    return {m.id: np.asarray(have[sig[m.id]], dtype=np.float32) for m in memes}


def embeddings_file(folder: str | Path, encoder: str) -> Path:
    """Where a stage keeps one retriever's embeddings (`embed_memes`' cache)."""
    return Path(folder) / f"embeddings_{encoder.replace('/', '_')}.npz"


def rank(emb: dict[str, np.ndarray], queries: Sequence[str], pool: Sequence[str], n: int
         ) -> tuple[np.ndarray, np.ndarray]:
    """The `n` pool memes nearest each query by cosine of their embeddings (`emb`: id -> L2-normalised
    vector), most similar first, ties in pool order: (indices into `pool` [q, n], similarities [q, n]).
    The one embed-and-rank of the compendium: exemplar retrieval, the few-shot moderator of notebook 06
    and the agents' nearest-training-meme baseline."""
    missing = [i for i in list(pool) + list(queries) if i not in emb]
    if missing:
        raise KeyError(f"no image embedding for memes {missing[:5]} (embed every meme first)")
    return top_n(np.stack([emb[i] for i in queries]), np.stack([emb[i] for i in pool]), n)


def top_n(queries: np.ndarray, index: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-n rows of `index` by cosine for each query (rows L2-normalised), most similar
    first; equal similarities keep index order. Returns (indices [q, n], similarities [q, n])."""
    if n > len(index):
        raise ValueError(f"top_n: n = {n} exemplars requested from a pool of {len(index)}")
    S = queries @ index.T
    idx = np.argsort(-S, axis=1, kind="stable")[:, :n]
    return idx, np.take_along_axis(S, idx, axis=1)


def retrieval_quality(ranked: np.ndarray, pool: Sequence[Meme], queries: Sequence[Meme]) -> dict[str, float]:
    """How often the top-n exemplars share the query's label (and SMI type where known), beside the
    base rate: the chance a uniformly drawn pool meme does."""
    pl = np.array([m.label for m in pool])
    ql = np.array([m.label for m in queries])
    agree = (pl[ranked] == ql[:, None]).mean()
    base = np.mean([(pl == q).mean() for q in ql])
    out = {"label_agreement": float(agree), "label_base_rate": float(base), "n_queries": len(queries),
           "n": int(ranked.shape[1])}
    if all(m.type for m in pool) and all(m.type for m in queries):
        pt = np.array([m.type for m in pool])
        qt = np.array([m.type for m in queries])
        out["type_agreement"] = float((pt[ranked] == qt[:, None]).mean())
        out["type_base_rate"] = float(np.mean([(pt == q).mean() for q in qt]))
    return out


def knn_vote(ranked: np.ndarray, pool: Sequence[Meme]) -> list[int]:
    """Majority gold label of the exemplars; a tie goes to the most similar exemplar's label."""
    out = []
    for row in ranked:
        labs = [pool[j].label for j in row]
        c = Counter(labs).most_common()
        out.append(labs[0] if len(c) > 1 and c[0][1] == c[1][1] else c[0][0])
    return out
