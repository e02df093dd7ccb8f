"""Image files -> an encoder's processor inputs, batch by batch, optionally on threads ahead of the model.

On a GPU the model waits for the CPU to decode and resize each batch unless the next batches are prepared
while it runs; on a CPU the model already uses every core and a helper thread only competes with it. The
pixels are the same either way: the encoder's own processor on the same decoded images, in the same order
and the same batches (CLIP4DM's attribution and TRACE's feature cache both read images this way)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

from PIL import Image


def default_loader_workers(device: Any = None) -> int:
    """Threads that decode and preprocess images ahead of the model: none on a CPU (the model uses every
    core; on 2 cores a helper thread slowed CLIP4DM's batched path), on a GPU up to 8, leaving one core free."""
    dev = str(device or "cpu")
    return 0 if not dev.startswith("cuda") else max(1, min(8, (os.cpu_count() or 2) - 1))


def load_pixels(encoder, paths: Sequence[Any], pin: bool = False) -> dict[str, Any]:
    """Image files -> the encoder's processor inputs; in pinned memory when `pin` (a GPU's copy can then
    overlap)."""
    import torch                                       # lazy: the package's modules load torch on first use
    with_images = []
    for p in paths:
        with Image.open(p) as im:
            with_images.append(im.convert("RGB"))
    pix = encoder.preprocess(with_images)
    if pin:
        pix = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in pix.items()}
    return pix


def image_batches(encoder, paths: Sequence[Any], batch_size: int, workers: int | None = None
                  ) -> Iterator[tuple[list[Any], dict[str, Any]]]:
    """Yields (paths of the batch, processor inputs) for image files, `batch_size` at a time, in order.
    With `workers` > 0 the files are decoded and preprocessed on that many threads, up to 2 x workers
    batches ahead of the model (PIL's decoding and resizing release the interpreter lock); 0 loads each
    batch in line. None: `default_loader_workers` for the encoder's device."""
    import torch                                       # lazy: the package's modules load torch on first use
    device = getattr(encoder, "device", None)
    workers = default_loader_workers(device) if workers is None else int(workers)
    if workers < 0:
        raise ValueError(f"image_batches: workers must be >= 0, got {workers}")
    parts = [list(paths[s:s + batch_size]) for s in range(0, len(paths), batch_size)]
    if workers == 0:
        for part in parts:
            yield part, load_pixels(encoder, part)
        return
    pin = str(device or "cpu").startswith("cuda") and torch.cuda.is_available()
    with ThreadPoolExecutor(workers) as pool:
        ahead = 2 * workers
        futs = [pool.submit(load_pixels, encoder, part, pin) for part in parts[:ahead]]
        for j, part in enumerate(parts):
            pix = futs[j].result()
            futs[j] = None                             # keep no more than `ahead` batches in memory
            if j + ahead < len(parts):
                futs.append(pool.submit(load_pixels, encoder, parts[j + ahead], pin))
            yield part, pix
