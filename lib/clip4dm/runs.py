"""CLIP4DM at scale: word attributions for many (image file, caption) pairs cached as JSON lines
(resumable), each image decoded and embedded once by the shared loader, and the speed measurements
(batched vs one pair at a time, the floor with pixels ready, the loader's ratio to it).
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from PIL import Image
from tqdm.auto import tqdm

from lib.models.encoders.loading import default_loader_workers, image_batches as encoder_image_batches, load_pixels
from lib.compendium.artifacts import code_of
from lib.clip4dm.method import CLIP4DM, length_batches
from lib.compendium import sharding


# ----------------------------------------------------------------------------- speed
@dataclass
class SpeedResult:
    pairs: int
    batch_size: int
    pairs_per_s_batched: float
    pairs_per_s_single: float
    max_abs_diff: float

    @property
    def speedup(self) -> float:
        return self.pairs_per_s_batched / self.pairs_per_s_single


def ready_pixels(model: CLIP4DM, images) -> list | None:
    """The images as the per-image pixel tensors `CLIP4DM.batch` accepts (preprocessing done
    once, off the timed path), or None where the processor needs more than pixel values (e.g.
    SigLIP2's patch masks and shapes)."""
    pix = model.encoder.preprocess(list(images))
    return list(pix["pixel_values"]) if set(pix.keys()) == {"pixel_values"} else None


def _floor_pass(model: CLIP4DM, images, captions, batch_size: int):
    """A callable running the floor once: for each batch of the batched path (the same
    length-sorted indices), a plain forward of image and text (eager attention) and one backward
    of the cosine to the attributed attention maps, on inputs prepared here beforehand."""
    import torch
    import torch.nn.functional as F
    enc = model.encoder
    k = -model.start_layer_text
    chunks = []
    for idx in length_batches(captions, batch_size):
        tok = enc.tokenize([model.template + captions[i] for i in idx])
        ims = [images[i] for i in idx]
        pix = {"pixel_values": torch.stack(ims)} if isinstance(ims[0], torch.Tensor) else enc.preprocess(ims)
        chunks.append((tok, pix))

    def run():
        for tok, pix in chunks:
            with torch.no_grad():
                img = F.normalize(enc.encode_images(pix, normalize=False).float(), dim=-1)
            with torch.enable_grad():
                emb, atts, _ = enc.text_forward_with_attentions(tok)
                sims = (img * F.normalize(emb.float(), dim=-1)).sum(-1)
                torch.autograd.grad(sims.sum(), atts[-k:])
    return run


def _best_of(fns, repeats: int) -> list[float]:
    """Seconds per call of each function, best of `repeats` rounds after one warm-up round; each
    round calls them in turn, so a change in the machine's load reaches all of them. The garbage
    collector is off while a call is timed, as in timeit."""
    best = [float("inf")] * len(fns)
    for rep in range(repeats + 1):
        for j, f in enumerate(fns):
            gc.collect()
            was = gc.isenabled()
            gc.disable()
            try:
                t0 = time.perf_counter()
                f()
                dt = time.perf_counter() - t0
            finally:
                if was:
                    gc.enable()
            if rep:
                best[j] = min(best[j], dt)
    return best


def floor_pairs_per_s(model: CLIP4DM, images, captions, batch_size: int = 32, repeats: int = 3) -> float:
    """The floor of the batched path: pairs per second of a plain forward (image and text, eager
    attention) plus one backward of the cosine to the attributed attention maps, on the batched
    path's batches, with inputs already preprocessed and tokenised (the best of `repeats`)."""
    return len(captions) / _best_of([_floor_pass(model, images, captions, batch_size)], repeats)[0]


def floor_and_batched(model: CLIP4DM, images, captions, batch_size: int = 32, repeats: int = 5
                      ) -> tuple[float, float, bool]:
    """Pairs per second of the floor and of the batched path on the same inputs, timed in
    alternation. The batched path gets the images as ready pixel tensors (preprocessed once,
    outside the timing, like the floor's inputs) and the captions as text: it tokenises,
    attributes and assembles words inside the timing. Returns (floor, batched, pixels_ready);
    pixels_ready is False where the processor's output is not plain pixel values, and then both
    take the images as given."""
    pix = ready_pixels(model, images)
    inputs = pix if pix is not None else list(images)
    floor, batched = _best_of([_floor_pass(model, inputs, captions, batch_size),
                               lambda: model.batch(inputs, captions, batch_size=batch_size)], repeats)
    return len(captions) / floor, len(captions) / batched, pix is not None


def reuse_pairs_per_s(model: CLIP4DM, image_paths: Sequence[str], captions: Sequence[str], batch_size: int = 32,
                      repeats: int = 3) -> float:
    """Benchmark-level throughput with image reuse: every distinct image file read, preprocessed and
    embedded once, then every caption attributed against its image's embedding (what
    `attribute_pairs` does), in pairs per second end to end (the best of `repeats`)."""
    import torch
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        uniq = list(dict.fromkeys(image_paths))
        emb = {}
        for s in range(0, len(uniq), batch_size):
            part = uniq[s:s + batch_size]
            emb.update(zip(part, model.image_embeddings([Image.open(p).convert("RGB") for p in part])))
        for s in range(0, len(captions), batch_size):
            caps = list(captions[s:s + batch_size])
            e = torch.stack([emb[p] for p in image_paths[s:s + batch_size]])
            scores, offsets, sims, texts = model.token_scores(None, caps, image_embeds=e)
            [model._words(t, sc, of, float(c)) for t, sc, of, c in zip(texts, scores, offsets, sims)]
        best = min(best, time.perf_counter() - t0)
    return len(captions) / best


def benchmark(model: CLIP4DM, images, captions, batch_size: int = 32, repeats: int = 3) -> SpeedResult:
    """Pairs per second batched vs one pair at a time on the same pairs (best of `repeats` timed
    runs of each, after a warm-up, as timeit does), and the largest difference between the two
    paths' word attributions, sums and CLIPScores."""
    model(images[0], captions[0])                                   # warm-up: allocator, kernels
    model.batch(images[:batch_size], captions[:batch_size], batch_size=batch_size)
    t_single = t_batched = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        single = [model(im, c) for im, c in zip(images, captions)]
        t_single = min(t_single, time.perf_counter() - t0)
        t0 = time.perf_counter()
        batched = model.batch(images, captions, batch_size=batch_size)
        t_batched = min(t_batched, time.perf_counter() - t0)
    diff = 0.0
    for a, b in zip(single, batched):
        diff = max(diff, abs(a["sum_negative_attribution"] - b["sum_negative_attribution"]),
                   abs(a["clip_score"] - b["clip_score"]),
                   *[abs(x[1] - y[1]) for x, y in zip(a["word_attributions"], b["word_attributions"])])
    return SpeedResult(len(captions), batch_size, len(captions) / t_batched, len(captions) / t_single, diff)


# ----------------------------------------------------------------------------- image loading
def embed_image_files(model: "CLIP4DM", paths: Sequence[str], batch_size: int = 32, workers: int | None = None,
                      progress: bool = False, desc: str = "CLIP4DM: images") -> dict[str, Any]:
    """{path: normalised image embedding} for distinct image files, loaded by `image_batches`."""
    paths = list(dict.fromkeys(paths))
    emb: dict[str, Any] = {}
    bar = tqdm(total=len(paths), desc=desc, disable=not progress or not paths)
    for part, pix in encoder_image_batches(model.encoder, paths, batch_size, workers):
        emb.update(zip(part, model.image_embeddings(pix)))
        bar.update(len(part))
    bar.close()
    return emb


def loader_ratio(model: "CLIP4DM", image_paths: Sequence[str], captions: Sequence[str], batch_size: int = 32,
                 workers: int | None = None, repeats: int = 3) -> dict[str, Any]:
    """How close attribution from image files comes to the model's own speed: pairs per second through
    `attribute_pairs` itself (the production path: decode and preprocess on the loader's threads, embed,
    attribute, assemble words, write the cache's lines; a fresh cache each time) against the floor on the same
    pairs with the pixels already prepared (embed, attribute, assemble), timed in alternation, best of
    `repeats`. On a GPU the loader's threads should bring the ratio near 1; on a CPU both share the same cores."""
    import torch
    if len(image_paths) != len(captions):
        raise ValueError(f"loader_ratio: {len(image_paths)} images but {len(captions)} captions")
    w = default_loader_workers(getattr(model.encoder, "device", None)) if workers is None else int(workers)
    ready = [load_pixels(model.encoder, image_paths[s:s + batch_size])
             for s in range(0, len(image_paths), batch_size)]

    def attribute(embs):
        for s, e in zip(range(0, len(captions), batch_size), embs):
            caps = list(captions[s:s + batch_size])
            scores, offsets, sims, texts = model.token_scores(None, caps, image_embeds=e)
            [model._words(t, sc, of, float(c)) for t, sc, of, c in zip(texts, scores, offsets, sims)]
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    runs = iter(range(10 ** 6))

    def from_files():
        with tempfile.TemporaryDirectory(prefix="clip4dm-ratio-") as tmp:
            attribute_pairs(model, list(zip(image_paths, captions)), Path(tmp) / f"run{next(runs)}.jsonl",
                            batch_size=batch_size, progress=False, workers=w)
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def floor():
        attribute(model.image_embeddings(pix) for pix in ready)

    t_files, t_floor = _best_of([from_files, floor], repeats)
    n = len(captions)
    return {"pairs": n, "batch_size": batch_size, "workers": w, "from_files_pairs_per_s": n / t_files,
            "floor_pairs_per_s": n / t_floor, "ratio": t_floor / t_files}


def _read_cache(path: Path, truncate: bool = True) -> dict[str, dict[str, Any]]:
    """The rows of an attribution cache file by key; a last line cut short by a crash is dropped (its pairs are
    computed again), and cut off the file when `truncate` (the file this process appends to)."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        if truncate:
            with open(path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
        data = data[:data.rfind(b"\n") + 1]
    out = {}
    for line in data.decode("utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        out[row["key"]] = row
    return out


def attribute_pairs(model: CLIP4DM, pairs: Sequence[tuple[str, str]], cache_path, batch_size: int = 32,
                    progress: bool = True, desc: str = "CLIP4DM", workers: int | None = None) -> list[dict[str, Any]]:
    """Word attributions and cosine for (image path, caption) pairs, stored as JSON lines in
    `cache_path` chunk by chunk: a rerun (or a run resumed after a crash) computes only the
    pairs not stored yet. The model's settings are part of each line's key. Each distinct image is
    embedded once, its file decoded and preprocessed by `image_batches` (`workers` threads ahead of the
    model; None: none on a CPU, several on a GPU; the same pixels either way)."""
    import torch
    cache_path = Path(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    tag = json.dumps([model.template, model.start_layer_text,
                      model.encoder.preset.identity() if model.encoder.preset else None, "format 2",
                      code_of("lib.clip4dm.method", "lib.models.encoders.base", "lib.models.encoders.hf",
                              *[m for m in (type(model.encoder).__module__,) if m.startswith("lib.")])], sort_keys=True)

    def key(p):
        return hashlib.sha1(f"{tag}\x00{os.path.realpath(p[0])}\x00{p[1]}".encode()).hexdigest()
    rank, world = sharding.launch()
    out_file = cache_path if world == 1 else cache_path.with_name(f"{cache_path.name}.rank{rank}")
    done: dict[str, dict[str, Any]] = {}
    # the cache, and under a launch each process's own file beside it (any earlier launch's too: a resume reads
    # all); under a launch every process reads them between two barriers, before any writes, so all see the same
    # pairs done and share out the same chunks; a line cut short by a crash is cut off only in one's own file
    sharding.barrier()
    for f in [cache_path, *sorted(cache_path.parent.glob(f"{cache_path.name}.rank*"))]:
        done.update(_read_cache(f, truncate=f == out_file))
    sharding.barrier()
    keys = [key(p) for p in pairs]
    todo = list(dict.fromkeys(k for k in keys if k not in done))
    by_key = {k: p for k, p in zip(keys, pairs)}
    # each image is embedded once, however many captions it has (FOIL-style benchmarks score 2-4), as the pairs
    # first need it: the loader's threads decode and preprocess the next images while the model attributes the
    # pairs whose images are ready (the same image batches and pair chunks as embedding every image first, so
    # the same numbers), and an embedding is dropped after its last pair. Under a launch of several processes
    # each runs every world-th chunk of pairs (`lib.compendium.sharding`) and the image batches those need, the
    # same batches as one process, so the same numbers; every process returns every pair's row
    pair_chunks = sharding.chunks(todo, batch_size)
    my_chunks = sharding.mine(len(pair_chunks), rank, world)
    images = list(dict.fromkeys(by_key[k][0] for k in todo))
    image_chunks = sharding.chunks(images, batch_size)
    chunk_of = {p: j for j, b in enumerate(image_chunks) for p in b}
    needed = sorted({chunk_of[by_key[k][0]] for j in my_chunks for k in pair_chunks[j]})
    flat = [p for j in needed for p in image_chunks[j]]       # re-chunked by batch_size: the same image batches
    batches = encoder_image_batches(model.encoder, flat, batch_size, workers) if flat else iter(())
    last_use = {by_key[k][0]: j for j in my_chunks for k in pair_chunks[j]}
    emb: dict[str, Any] = {}
    bar = tqdm(total=len(my_chunks), desc=desc, disable=not progress or not todo)
    position = iter(my_chunks)

    def embedded(paths: list[str]) -> None:
        while any(p not in emb for p in paths):
            part, pix = next(batches)
            emb.update(zip(part, model.image_embeddings(pix)))

    def attribute(chunk: list[str]) -> list[dict[str, Any]]:
        j = next(position)
        embedded([by_key[k][0] for k in chunk])
        scores, offsets, sims, texts = model.token_scores(None, [by_key[k][1] for k in chunk],
                                                         image_embeds=torch.stack([emb[by_key[k][0]] for k in chunk]))
        rows = []
        for k, t, sc, of, c in zip(chunk, texts, scores, offsets, sims):
            r = model._words(t, sc, of, float(c))
            rows.append({"key": k, "caption": by_key[k][1], "cos": float(c),
                         "word_attributions": [list(x) for x in r["all_word_attributions"]],
                         "word_positions": r["word_positions"]})
        for k in chunk:
            if last_use[by_key[k][0]] <= j:
                emb.pop(by_key[k][0], None)
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
        f.flush()
        os.fsync(f.fileno())
        bar.update(1)
        return rows
    with open(out_file, "a", encoding="utf-8") as f:
        rows = sharding.all_chunks(todo, batch_size, attribute, (rank, world))
    bar.close()
    done.update((r["key"], r) for r in rows)
    return [done[k] for k in keys]
