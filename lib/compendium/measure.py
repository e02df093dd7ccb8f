"""Measured costs on the visible GPU (`python -m lib.compendium.costs --measure`): the paper profile's agent recipe at
the checkpoint's full shape with random weights, CLIP4DM from image files against its floor, and TRACE's
feature cache and training epoch at a CLIP shape.

For each batch size and gradient-checkpointing setting it trains a random PaliGemma-3B-448
(`lib.models.smoke.paligemma(full_shape=True)`) through `lib.sei.agents.train_agent`, the paper
profile's recipe otherwise, for two short epochs on memes whose prompts fill about `max_len` tokens, and
records the peak GPU memory, the seconds per example of the second epoch (the first pays for warm-up),
`lib.models.train_memory`'s estimate beside the peak, and the model-FLOPs utilisation the conventional way:
6 x non-embedding parameters x tokens per example plus the decoder's attention (12 x layers x hidden x tokens^2; forward and
backward, a checkpointing recompute not counted) against the GPU's dense bf16 peak from its datasheet
(`DATASHEET_BF16_TFLOPS`; none for a GPU the table does not know). Beside it, labelled, the same FLOPs against
the bf16 matrix rate measured here by a large matrix product, which reads higher (a GPU reaches about two
thirds of its datasheet rate on a plain matrix product). A setting `train_agent` refuses (it cannot fit) is a
row that says so. `toy=True` runs the same code at the tiny shape on the CPU (what the tests do): the
numbers then check the plumbing, not a GPU.

The record is written to `artifacts/measured/<gpu>.json` with the GPU's name, torch and CUDA versions;
copy it under `results/gpu/` to cite it.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from lib import ROOT
from lib.models import smoke as smoke_models
from lib.sei.agents import AgentRecipe, build_agent_data, train_agent
from lib.compendium.artifacts import git_revision, write_json
from lib.clip4dm.method import CLIP4DM
from lib.clip4dm.runs import loader_ratio
from lib.models.encoders.loading import default_loader_workers
from lib.data.records import ExplanationRecord, MemeRecord
from lib.models.encoders import load_encoder
from lib.compendium.params import load_profile
from lib.trace.model import TrainConfig
from lib.trace.training import Trainer
from lib.trace.features import FeatureCache, MemeBatchData
from lib.trace.runs import lowest_layer, split_rows
from lib.models.train_memory import GIB, RecipeMemoryError, shape_of
from lib.models.chat import Chat, GenParams, image, text, user
from lib.models.chat.hf import HFChatBackend
from lib.models.nli import nli_entailment


#: dense (no sparsity) bf16 Tensor Core peaks in TFLOP/s from NVIDIA's datasheets, matched in this order against
#: `torch.cuda.get_device_name()` (the first key the name contains; None: a GPU whose peak is not listed here)
DATASHEET_BF16_TFLOPS: tuple[tuple[str, float | None], ...] = (
    ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("B200", 2250.0), ("A100", 312.0),
    ("A10G", None), ("A10", 125.0), ("L40S", 362.1), ("L4", 121.0))


def datasheet_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name (DATASHEET_BF16_TFLOPS), None when the table does not know it."""
    for key, peak in DATASHEET_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return peak
    return None


def training_flops(shape, tokens: float) -> float:
    """FLOPs of one training example (forward and backward): 6 x non-embedding parameters x tokens plus the
    decoder's attention scores and weighted sums, 12 x layers x hidden x tokens^2 (the usual model-FLOPs count,
    no recompute). The token embedding, tied to the output layer, is left out: the embedding is a lookup, and the
    answer-only loss runs the output layer on the answer's few positions, not on every token."""
    d = shape.decoder
    return 6 * (shape.params - shape.vocab * d.hidden) * tokens + 12 * d.layers * d.hidden * tokens ** 2


def matmul_tflops(device: str, size: int = 8192, repeats: int = 20) -> float:
    """The device's bf16 (CPU: float32) dense matrix rate in TFLOP/s, from `size` x `size` products."""
    import torch
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * size ** 3 * repeats / (time.perf_counter() - t0) / 1e12


def long_examples(folder: Path, n: int, words: int):
    """`n` explainer examples whose meme text and reasoning each run to about `words` words."""
    folder.mkdir(parents=True, exist_ok=True)
    filler = ("the river folk should leave the city they say and the sign repeats it " * 40).split()[:words]
    memes, hat = [], []
    for i in range(n):
        p = folder / f"{i:05d}.png"
        Image.new("RGB", (600, 500), (20 * i % 256, 100, 200 - 10 * i % 200)).save(p)
        memes.append(MemeRecord(str(i), p, f"text {i} " + " ".join(filler), i % 2, "train"))
        hat.append(ExplanationRecord(str(i), p, ["group"] if i % 2 else [], [f"because {i} " + " ".join(filler[:words // 3])],
                                     "train"))
    return build_agent_data([], hat, [], memes)["explainer"]


def measure_agent(batch_sizes: Sequence[int] = (2, 4, 8), checkpointing: Sequence[bool] = (False, True),
                  toy: bool = False, profile: str = "paper", work: Path | None = None,
                  progress: bool = False) -> dict[str, Any]:
    """Rows of (batch size, checkpointing) -> peak GiB, estimate GiB, s per example, MFU (see the module
    docstring). On a machine without a GPU only `toy=True` runs."""
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not toy:
        raise RuntimeError("lib.compendium.costs --measure needs a visible CUDA GPU (on a CPU, --toy runs the same code at a "
                           "tiny shape, to check it)")
    section = load_profile(profile)["04_few_shot"]["agent_recipe"]
    tmp = tempfile.TemporaryDirectory(prefix="measure-") if work is None else None
    root = Path(tmp.name) if tmp else Path(work)
    try:
        base = smoke_models.paligemma(root / "base", full_shape=not toy, device=device)
        from transformers import AutoConfig, AutoModelForImageTextToText
        with torch.device("meta"):                      # the shape without loading the weights
            shape = shape_of(AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(base)))
        params = shape.params
        name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (toy shape)"
        peak = datasheet_tflops(name) if device == "cuda" else None
        rate = matmul_tflops(device, size=8192 if device == "cuda" else 256, repeats=20 if device == "cuda" else 3)
        max_len = int(section.get("max_len", 1536)) if not toy else 1536
        words = 80 if not toy else 60                 # about 1,450 and 1,360 tokens with the image's 1,024
        rows = []
        for b in batch_sizes:
            for ckpt in checkpointing:
                recipe = AgentRecipe(base=str(base), **{**section, "epochs": 2, "batch_size": b, "grad_accum": 1,
                                                        "max_train": 2 * b, "gradient_checkpointing": ckpt,
                                                        "max_len": max_len, "lr": 1e-5,
                                                        **({"mixed_precision": "no", "dtype": "float32"} if toy else {})})
                row: dict[str, Any] = {"batch_size": b, "gradient_checkpointing": ckpt}
                if device == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                held = torch.cuda.memory_allocated() if device == "cuda" else 0
                try:
                    rec = train_agent(long_examples(root / "memes", 2 * b, words), root / f"agent_b{b}_{int(ckpt)}", recipe,
                                      "explain why {label} {ocr}", progress=progress, force=True)
                except RecipeMemoryError as e:
                    rows.append({**row, "refused": re.sub(r"\s+", " ", str(e))})
                    continue
                second = rec["curve"][1]["seconds"] - rec["curve"][0]["seconds"]
                s_per = second / rec["n_train"]
                tokens = rec["tokens_per_example"]
                row.update({"peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 2) if device == "cuda" else None,
                            "estimate_gib": rec.get("memory_estimate_gib"), "s_per_example": round(s_per, 4),
                            "tokens_per_example": tokens,
                            "mfu": round(training_flops(shape, tokens) / s_per / (peak * 1e12), 4) if peak else None,
                            "mfu_vs_measured_matmul": round(training_flops(shape, tokens) / s_per / (rate * 1e12), 4),
                            "update_share": rec.get("update_share"),
                            # what the device still holds once train_agent has returned (its model, gradients and
                            # Adam state should be gone)
                            "left_gib": round((torch.cuda.memory_allocated() - held) / GIB, 3) if device == "cuda" else None})
                rows.append(row)
        return {"what": "the paper profile's agent recipe through lib.sei.agents.train_agent, random weights of "
                        + ("a tiny PaliGemma (toy)" if toy else "PaliGemma-3B-448's shape"),
                "device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
                "parameters": params, "datasheet_bf16_tflops": peak, "matmul_tflops": float(f"{rate:.4g}"),
                "max_len": max_len, "runs": rows}
    finally:
        if tmp is not None:
            tmp.cleanup()


def memes_on_disk(folder: Path, n: int, size: tuple[int, int] = (600, 500), seed: int = 0) -> list[str]:
    """`n` meme-sized noisy PNG files (decoding and resizing them costs what a real meme's does)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        p = folder / f"{i:05d}.png"
        if not p.exists():
            Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    return paths


def measure_clip4dm(shapes: Sequence[str] = ("B/32", "H/14"), batch_sizes: Sequence[int] = (64, 256), n: int = 1024,
                    toy: bool = False, work: Path | None = None) -> dict[str, Any]:
    """CLIP4DM from image files against its floor (`lib.clip4dm.runs.loader_ratio`): for each CLIP shape (random
    weights) and batch size, pairs per second end to end with the loader's default threads and with none,
    and with the pixels ready. `toy`: the tiny CLIP on the CPU, a few pairs (the tests' plumbing check)."""
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not toy:
        raise RuntimeError("measure_clip4dm: no GPU is visible; toy=True runs the tiny shape on the CPU")
    tmp = tempfile.TemporaryDirectory(prefix="measure-clip4dm-") if work is None else None
    root = Path(tmp.name) if tmp is not None else Path(work)
    try:
        caps = [f"a photo of {w} people standing near the {v} sign" for w, v in
                zip(("river", "hill", "salt", "moon") * n, ("red", "blue", "grey", "old", "new") * n)][:n if not toy else 8]
        paths = memes_on_disk(root / "memes", len(caps), size=(600, 500) if not toy else (64, 48))
        rows = []
        for shape in (shapes if not toy else ("tiny",)):
            d = root / shape.replace("/", "-")
            if not (d / "config.json").exists():
                smoke_models.clip(d) if toy else smoke_models.clip_full_shape(d, shape)
            model = CLIP4DM.from_pretrained(str(d), device=device)
            for b in (batch_sizes if not toy else (4,)):
                for w in dict.fromkeys((default_loader_workers(device), 0)):
                    r = loader_ratio(model, paths, caps, batch_size=b, workers=w, repeats=1 if toy else 2)
                    rows.append({"shape": shape, **{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}})
            del model
            if device == "cuda":
                torch.cuda.empty_cache()
        name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (toy shape)"
        return {"what": "CLIP4DM attribution from image files (decode, preprocess, embed, attribute) against the same "
                        "pairs with the pixels ready, random weights of each CLIP shape",
                "device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "cpu_cores": os.cpu_count(),
                "runs": rows}
    finally:
        if tmp is not None:
            tmp.cleanup()


def measure_trace(shape: str = "L/14", n: int = 2000, toy: bool = False, work: Path | None = None) -> dict[str, Any]:
    """TRACE at a CLIP shape (random weights; the paper profile's main backbone is L/14) on `n` meme-sized
    PNGs with five candidate captions each, the official recipe otherwise: the frozen-feature cache's memes
    per second, one training epoch's seconds per 1,000 training memes (the fastest of two), and the peak GPU
    memory of both. `toy`: the tiny CLIP on the CPU, a few memes (the tests' plumbing check)."""
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not toy:
        raise RuntimeError("measure_trace: no GPU is visible; toy=True runs the tiny shape on the CPU")
    n = 24 if toy else n
    tmp = tempfile.TemporaryDirectory(prefix="measure-trace-") if work is None else None
    root = Path(tmp.name) if tmp is not None else Path(work)
    try:
        paths = memes_on_disk(root / "memes", n, size=(600, 500) if not toy else (64, 48), seed=1)
        cols = [f"caption_{k}" for k in range(5)]
        splits = ["train"] * 8 + ["dev_seen", "test_seen"]
        recs = [MemeRecord(str(i), Path(p), f"meme text {i} about the river folk and their signs", i % 2,
                           splits[i % len(splits)], captions={c: f"candidate {k} of meme {i}: a sign by the water"
                                                               for k, c in enumerate(cols)})
                for i, p in enumerate(paths)]
        data = MemeBatchData.from_records(recs, cols)
        d = root / ("tiny" if toy else shape.replace("/", "-"))
        if not (d / "config.json").exists():
            smoke_models.clip(d) if toy else smoke_models.clip_full_shape(d, shape)
        enc = load_encoder(str(d), device=device)
        cfg = TrainConfig(epochs=1) if not toy else TrainConfig(epochs=1, hidden=16, batch_size=4, grad_accum=1)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        cache = FeatureCache(enc, data, lowest_unfrozen=lowest_layer(enc, cfg.unfreeze_text_layers), progress=False)
        cache_s = time.perf_counter() - t0
        train, _, _ = split_rows(data)
        epoch_s = Trainer(enc, data, cfg, cache, progress=False).time_epoch(train, repeats=2)
        name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (toy shape)"
        return {"what": f"TRACE's feature cache and one training epoch (official recipe, batch {cfg.batch_size} x "
                        f"accumulation {cfg.grad_accum}), random weights of CLIP {shape if not toy else 'tiny'}",
                "device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "memes": n,
                "train_memes": int(len(train)), "cache_memes_per_s": round(n / cache_s, 2),
                "epoch_s_per_1000_train": round(epoch_s / len(train) * 1000, 3),
                "peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 2) if device == "cuda" else None}
    finally:
        if tmp is not None:
            tmp.cleanup()


#: InternVL3.5-8B's sizes (InternViT-300M; the Qwen3-8B decoder), applied to the stand-in's configuration (whose small
#: tokenizer keeps the vocabulary head small: the decoding rate is the layers')
INTERNVL_8B = {"vision": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16),
               "text": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                            num_key_value_heads=8, head_dim=128)}
#: facebook/bart-large-mnli's sizes
BART_LARGE = dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                  decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024)
GENERATION_PARTS = ("captioning", "silver", "nli", "few_shot")




def _generate_rate(chat, paths: Sequence[str], prompt: str, max_new_tokens: int) -> float:
    """Conversations per second of one image and a prompt each, generated `chat.batch_size` at a time."""
    import torch
    convs = [[user(image(str(p)), text(prompt))] for p in paths]
    t0 = time.perf_counter()
    chat.generate_many(convs, GenParams(temperature=0.0, max_new_tokens=max_new_tokens), progress=False)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return len(convs) / (time.perf_counter() - t0)


def measure_generation(parts: Sequence[str] = GENERATION_PARTS, toy: bool = False, n: int = 64,
                       work: Path | None = None, vllm_url: str | None = None, vllm_model: str | None = None
                       ) -> dict[str, Any]:
    """The GPU stages that generate or score rather than train, on the visible GPU with random weights of the
    paper's shapes: notebook 01's captioner (InternVL3.5-8B's layers through the HF chat backend, batch 16, 60 new
    tokens, 1000-px memes), notebook 04's silver texts (a PaliGemma-3B agent, batch 16, `agent_max_new_tokens`),
    SeeTRUE's NLI (BART-large-MNLI's shape, batch 32) and the few-shot calls through a vLLM server on this GPU
    (`vllm_url`: one started with docs/models-and-serving.md's flags; without it that part says so). Items per
    second and peak memory each. `toy`: the tiny stand-ins on the CPU, a few items (the tests' plumbing check)."""
    import torch
    from transformers import AutoConfig, AutoProcessor
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not toy:
        raise RuntimeError("measure_generation: no GPU is visible; toy=True runs the tiny shapes on the CPU")
    n = 4 if toy else n
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tmp = tempfile.TemporaryDirectory(prefix="measure-gen-") if work is None else None
    root = Path(tmp.name) if tmp is not None else Path(work)
    out: dict[str, Any] = {}
    section = load_profile("paper")["04_few_shot"]
    try:
        paths = memes_on_disk(root / "memes", n, size=(1000, 1000) if not toy else (64, 64), seed=3)

        def peak() -> float | None:
            return round(torch.cuda.max_memory_allocated() / GIB, 2) if device == "cuda" else None

        def reset() -> None:
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
        if "captioning" in parts:
            reset()
            from transformers import InternVLForConditionalGeneration
            d = smoke_models.internvl(root / "internvl")
            cfg = AutoConfig.from_pretrained(d)
            if not toy:
                for k, v in INTERNVL_8B["vision"].items():
                    setattr(cfg.vision_config, k, v)
                for k, v in INTERNVL_8B["text"].items():
                    setattr(cfg.text_config, k, v)
            with torch.device(device):
                model = InternVLForConditionalGeneration(cfg).to(dtype).eval()
            chat = Chat(HFChatBackend(str(d), model=model, processor=AutoProcessor.from_pretrained(d), device=device),
                        None, batch_size=16)
            rate = _generate_rate(chat, paths, "Describe this meme's picture in one sentence.", 60)
            out["captioning"] = {"what": "InternVL3.5-8B's layers (random bf16 weights, the stand-in's small vocabulary), "
                                         "HF chat backend, batch 16, 60 new tokens, 1000-px memes",
                                 "items": n, "items_per_s": round(rate, 3), "peak_gib": peak()}
            del chat, model
        if "silver" in parts:
            reset()
            d = smoke_models.paligemma(root / "paligemma", full_shape=not toy, device=device)
            chat = Chat(HFChatBackend(str(d), dtype="bfloat16" if device == "cuda" else "float32", device=device),
                        None, batch_size=16)
            new = int(section.get("agent_max_new_tokens", 100))
            rate = _generate_rate(chat, paths, "explain why this meme is hateful", new if not toy else 8)
            out["silver"] = {"what": f"a PaliGemma-3B-448 agent (random bf16 weights), batch 16, {new} new tokens",
                             "items": n, "items_per_s": round(rate, 3), "peak_gib": peak()}
            del chat
        if "nli" in parts:
            reset()
            from transformers import AutoTokenizer, BartForSequenceClassification
            d = smoke_models.bart_mnli(root / "bart")
            cfg = AutoConfig.from_pretrained(d)
            if not toy:
                for k, v in BART_LARGE.items():
                    setattr(cfg, k, v)
            with torch.device(device):
                model = BartForSequenceClassification(cfg).to(dtype).eval()
            m = 16 * n
            prem = [f"a person holds a red sign by the river number {i} while others watch" for i in range(m)]
            hyp = [f"the sign is red {i}" for i in range(m)]
            t0 = time.perf_counter()
            nli_entailment(prem, hyp, (model, AutoTokenizer.from_pretrained(d)), device=device, batch_size=32)
            if device == "cuda":
                torch.cuda.synchronize()
            out["nli"] = {"what": "BART-large-MNLI's shape (random weights), batch 32", "items": m,
                          "items_per_s": round(m / (time.perf_counter() - t0), 2), "peak_gib": peak()}
            del model
        if "few_shot" in parts:
            if not vllm_url:
                out["few_shot"] = {"skipped": "no vLLM server given: start one on this GPU with the flags of "
                                              "docs/models-and-serving.md and pass --vllm-url (and --vllm-model)"}
            else:
                from lib.models.chat.openai_compatible import OpenAICompatibleBackend  # lazy: needs jsonschema
                chat = Chat(OpenAICompatibleBackend(vllm_model or "model", vllm_url, api_key_optional=True), None,
                            max_workers=16)
                rate = _generate_rate(chat, paths, "Is this meme hateful? Answer yes or no, then say why.", 100)
                out["few_shot"] = {"what": f"{vllm_model} served by vLLM at {vllm_url}, one image per call, 100 new "
                                           "tokens, 16 calls at a time", "items": n, "items_per_s": round(rate, 3)}
        if toy:
            for v in out.values():
                if "what" in v:
                    v["what"] = "the tiny stand-in in place of " + v["what"]
        name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (toy shape)"
        return {"what": "generation and scoring stages at the paper's shapes, random weights", "device": name,
                "torch": torch.__version__, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
                "commit": git_revision(), "parts": out}
    finally:
        if tmp is not None:
            tmp.cleanup()


def measure(toy: bool = False, out_dir: Path | None = None,
            only: Sequence[str] = ("agent_training", "clip4dm", "trace", "generation"),
            vllm_url: str | None = None, vllm_model: str | None = None, **kw) -> Path:
    """Run the measurements (`only`: some of them) and write them to `artifacts/measured/<device>.json`,
    merged into what is there, each part stamped with the commit it measured; returns the path."""
    rec: dict[str, Any] = {}
    if "agent_training" in only:
        rec["agent_training"] = measure_agent(toy=toy, **kw)
    if "clip4dm" in only:
        rec["clip4dm"] = measure_clip4dm(toy=toy)
    if "trace" in only:
        rec["trace"] = measure_trace(toy=toy)
    if "generation" in only:
        rec["generation"] = measure_generation(toy=toy, vllm_url=vllm_url, vllm_model=vllm_model)
    commit = git_revision()
    for part in rec.values():
        part.setdefault("commit", commit)
        part.setdefault("date", time.strftime("%Y-%m-%d"))
    device = next(iter(rec.values()))["device"]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()
    path = (out_dir or ROOT / "artifacts" / "measured") / f"{slug}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    write_json(path, {**old, **rec})
    return path


def markdown(rec: dict[str, Any]) -> str:
    out = []
    if "agent_training" in rec:
        out += _agent_markdown(rec["agent_training"])
    if "clip4dm" in rec:
        c = rec["clip4dm"]
        out += (["", ""] if out else []) + [
            f"CLIP4DM, {c['what']}, on {c['device']} (torch {c['torch']}, CUDA {c['cuda']}, {c['cpu_cores']} CPU cores):",
            "", "| shape | batch | loader threads | from files, pairs/s | pixels ready, pairs/s | ratio |",
            "|---|---|---|---|---|---|"]
        out += [f"| {r['shape']} | {r['batch_size']} | {r['workers']} | {r['from_files_pairs_per_s']:.0f} | "
                f"{r['floor_pairs_per_s']:.0f} | {r['ratio']:.2f} |" for r in c["runs"]]
    if "generation" in rec:
        g = rec["generation"]
        out += (["", ""] if out else []) + [f"Generation and scoring on {g['device']} (torch {g['torch']}, CUDA {g['cuda']}):",
                                            "", "| stage | what | items/s | peak GiB |", "|---|---|---|---|"]
        for k, v in g["parts"].items():
            out.append(f"| {k} | {v.get('what', v.get('skipped', ''))} | "
                       f"{v['items_per_s'] if 'items_per_s' in v else 'not measured'} | {v.get('peak_gib') or ''} |")
    if "trace" in rec:
        t = rec["trace"]
        out += (["", ""] if out else []) + [
            f"TRACE, {t['what']}, on {t['device']} (torch {t['torch']}, CUDA {t['cuda']}), {t['memes']} memes: "
            f"feature cache {t['cache_memes_per_s']:.0f} memes/s; training {t['epoch_s_per_1000_train']:.1f} s per epoch "
            f"per 1,000 training memes" + (f"; peak {t['peak_gib']:.1f} GiB" if t["peak_gib"] is not None else "") + "."]
    return "\n".join(out)


def _agent_markdown(a: dict[str, Any]) -> list[str]:
    peak = a.get("datasheet_bf16_tflops")
    out = [f"Agent training, {a['what']}, on {a['device']} (torch {a['torch']}, CUDA {a['cuda']}; datasheet dense bf16 "
           f"peak {f'{peak:.0f} TFLOP/s' if peak else 'not known'}, bf16 matrix rate {a['matmul_tflops']:.0f} TFLOP/s "
           "measured here):", "",
           "| batch | checkpointing | peak GiB | estimate GiB | s per example | MFU (datasheet peak) | "
           "FLOPs / measured matmul rate |", "|---|---|---|---|---|---|---|"]
    for r in a["runs"]:
        if "refused" in r:
            out.append(f"| {r['batch_size']} | {r['gradient_checkpointing']} | refused: does not fit | | | | |")
        else:
            if "mfu_vs_measured_matmul" in r:
                mfu, vs = r["mfu"], r["mfu_vs_measured_matmul"]
            else:                           # a record from before the datasheet column: its "mfu" was the second
                mfu, vs = None, r.get("mfu")
            out.append(f"| {r['batch_size']} | {r['gradient_checkpointing']} | {r['peak_gib']} | {r['estimate_gib']} | "
                       f"{r['s_per_example']:.3f} | {f'{100 * mfu:.1f}%' if mfu is not None else '—'} | "
                       f"{f'{100 * vs:.1f}%' if vs is not None else '—'} |")
    return out
