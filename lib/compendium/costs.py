"""What the paper profile costs on one GPU: prompt lengths, GPU and host memory, GPU-hours per stage.

    python -m lib.compendium.costs                                  # the table for params/paper.yaml on one H100 80GB
    python -m lib.compendium.costs --image-size 600x600             # memes of another typical size
    python -m lib.compendium.costs --images data/fhm/img            # measured on the memes themselves (sizes read from files)
    python -m lib.compendium.costs --measure                        # agents, CLIP4DM, TRACE measured on the visible GPU (lib.compendium.measure)

Three kinds of number, and the table says which is which:

- **exact**: what follows from a checkpoint's configuration and the profile alone: image tokens
  per meme (counted by the models' own image processors in transformers: InternVL's tiling,
  Pixtral's 16-px patches with one break token per row, PaliGemma's fixed 1024), prompt tokens of
  an n-shot prompt, the vLLM `--max-model-len` that holds it, KV-cache bytes per token, weight
  bytes, and the host memory of notebook 02's feature cache (`feature_cache_bytes`, equal to
  `lib.trace.features.FeatureCache.nbytes` by construction and by test);
- **estimated**: the GPU memory of a training step (`lib.models.train_memory`: the larger of the forward and
  backward peak, with each layer's activations, a gated MLP, eager attention's quadratic term and float32
  logits over the vocabulary, and the optimizer step's, with the gradients, Adam's moments and its
  temporary; within 10% of the peaks measured for the agent recipe on an H100) and GPU time from FLOPs
  (`2 P T` per prompt token, `6 P T` per training token) at an assumed share of the GPU's peak, or
  from weight reads per decoding step; every assumption is a field of `Assumptions`;
- **cited**: CLIP4DM's captions per second on a GPU, from its paper;
- **measured**: a row whose work a committed GPU record measured on the table's GPU (`results/gpu/*.json`,
  written by `--measure` or `lib.compendium.gpu_check`): its time comes from the record, which the row names
  (GPU, torch, date, commit, the settings measured), with the estimate beside it; a measured model-FLOPs
  utilisation replaces `Assumptions.mfu_train` in the estimates that remain (labelled).

This compendium's own machines have no GPU; the records are what a borrowed GPU measured. A researcher who
runs a stage replaces an estimate with the stage's own `wall_s` / `train_s` in its metrics.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from lib.compendium.params import load_profile
from lib.models.train_memory import ModelShape, TowerShape, settings_that_fit, step_bytes

GIB = 1024 ** 3


@dataclass(frozen=True)
class Checkpoint:
    """The facts of one hub checkpoint that memory and time depend on (from its config.json)."""
    hub_id: str
    params_b: float           # all parameters, vision tower included, in billions
    layers: int               # decoder layers
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    image_rule: str           # internvl | pixtral | paligemma
    vision_layers: int = 0
    vision_hidden: int = 0
    note: str = ""


CHECKPOINTS: dict[str, Checkpoint] = {
    "internvl3.5-8b": Checkpoint(
        "OpenGVLab/InternVL3_5-8B-HF", 8.5, 36, 8, 128, 4096, 151_936, "internvl",
        note="Qwen3-8B decoder (36 layers, 8 KV heads of 128) + InternViT-300M; 448-px tiles of 256 tokens, "
             "1 to 12 tiles plus a thumbnail (max_dynamic_patch 12)"),
    "pixtral-12b": Checkpoint(
        "mistralai/Pixtral-12B-2409", 12.6, 40, 8, 128, 5120, 131_072, "pixtral",
        note="Mistral NeMo 12B decoder (40 layers, 8 KV heads of 128) + 0.4B vision encoder; longest edge "
             "1024 px, one token per 16-px patch and one break token per row"),
    "paligemma-3b-pt-448": Checkpoint(
        "google/paligemma-3b-pt-448", 2.92, 18, 1, 256, 2048, 257_216, "paligemma",
        vision_layers=27, vision_hidden=1152,
        note="Gemma-2B decoder (18 layers, one KV head of 256) + SigLIP-So400m/14 at 448 px: 1024 image tokens"),
}

#: PaliGemma-3B-448's training shape (lib.models.train_memory) from its config.json: Gemma-2B's gated MLP is 8x its
#: width, SigLIP-So400m sees 1024 patches, 257,216-token vocabulary; eager attention, as measured
PALIGEMMA_TRAINING = ModelShape(params=2.92e9, decoder=TowerShape(18, 2048, 16_384, 8, True), vocab=257_216,
                                image_tokens=1024, vision=TowerShape(27, 1152, 4304, 16, False), weight_bytes=2,
                                eager_attention=True)

#: the paper profile's data, in memes (public splits; REFERENCE.md and the See-Explain-Intervene
#: paper's Table 1 give the counts)
PAPER_SIZES = {
    "fhm": 12_540,            # train 8,500, dev_seen 500, dev_unseen 540, test_seen 1,000, test_unseen 2,000
    "fhm_train": 8_500,
    "multioff": 743,
    "mami_train": 10_000,
    "fhm_extended": 983,
    "mami_extended": 945,
    "hvli_test": 1_178,
    "agent_examples": 5_828 + 8_370 + 299 + 299,   # MemeCap train+val, HatReDAug, MemeSense x2 agents
}


@dataclass
class Assumptions:
    """What the estimates assume. Change one with a command-line flag or `replace(...)`."""
    gpu: str = "NVIDIA H100 80GB (SXM)"
    gpu_gib: float = 79.2             # what torch.cuda reports on an H100 80GB, less the CUDA context
    peak_tflops: float = 989.0        # dense bf16
    mfu_train: float = 0.30           # share of peak a training step reaches
    mfu_prefill: float = 0.40         # share of peak vLLM's prefill reaches
    hbm_tb_s: float = 3.35            # memory bandwidth: a decoding step reads every weight once
    decode_batch: int = 32            # sequences decoded together by vLLM
    hf_step_s: float = 0.03           # one transformers generate() step for a batch (Python overhead bound)
    hf_batch: int = 16                # the hf backend's batch
    vllm_overhead_gib: float = 4.0    # CUDA graphs, sampler, the vision encoder's profiling run
    image_size: tuple[int, int] = (1000, 1000)   # width, height of a typical meme when no images are given
    text_tokens_per_shot: int = 360   # an exemplar's text: OCR, caption, explanation and intervention (<= 100 each), label
    text_tokens_fixed: int = 700      # system prompt, definition, instructions, the query's text
    answer_tokens: int = 100          # the paper's max_new_tokens
    agent_answer_tokens: int = 250    # an agent's training target (a caption, explanation or intervention), at most
    trace_run_minutes: float = 6.0    # one TRACE run on cached features (30 epochs of 8,500 memes)
    clip4dm_captions_per_s: dict[str, float] = field(default_factory=lambda: {
        "clip-vit-b32": 12.0, "clip-vit-h14": 7.1})   # CLIP4DM paper, "FPS" on one GPU


# ----------------------------------------------------------------------------- exact: tokens and bytes

def image_tokens(rule: str, width: int, height: int, max_tiles: int = 12) -> int:
    """Tokens one image takes in a prompt, counted by the model's own processor in transformers."""
    if rule == "paligemma":
        return 1024
    if rule == "internvl":
        from transformers import GotOcr2ImageProcessor   # lazy: transformers is heavy
        proc = GotOcr2ImageProcessor(crop_to_patches=True, min_patches=1, max_patches=max_tiles,
                                     size={"height": 448, "width": 448})
        return 2 + 256 * proc.get_number_of_image_patches(height, width, {})   # <img> ... </img>
    if rule == "pixtral":
        import numpy as np                                # lazy: only this rule needs an array
        from transformers.models.pixtral.image_processing_pixtral import get_resize_output_image_size
        h, w = get_resize_output_image_size(np.zeros((height, width, 3), dtype=np.uint8), (1024, 1024), (16, 16))
        return (w // 16 + 1) * (h // 16)                 # a break token ends every row (the last one: [IMG_END])
    raise ValueError(f"image_tokens: unknown rule {rule!r} (internvl, pixtral, paligemma)")


def prompt_tokens(ck: Checkpoint, shots: int, image_tok: int, a: Assumptions) -> int:
    """Prompt plus answer tokens of an n-shot few-shot call: n exemplar images and the query's."""
    return (shots + 1) * image_tok + shots * a.text_tokens_per_shot + a.text_tokens_fixed + a.answer_tokens


def round_up(n: int, step: int = 4096) -> int:
    return int(math.ceil(n / step) * step)


def kv_bytes_per_token(ck: Checkpoint, dtype_bytes: int = 2) -> int:
    return 2 * ck.layers * ck.kv_heads * ck.head_dim * dtype_bytes


def weight_bytes(ck: Checkpoint, dtype_bytes: int = 2) -> float:
    return ck.params_b * 1e9 * dtype_bytes


def vllm_utilization(ck: Checkpoint, max_model_len: int, sequences: int, a: Assumptions,
                     tensor_parallel: int = 1) -> float:
    """--gpu-memory-utilization that holds the weights, vLLM's overhead and KV for `sequences`
    prompts of max_model_len (vLLM refuses to start without room for one), on each of `tensor_parallel` GPUs
    (`--tensor-parallel-size`: each holds its share of the weights and of every KV head it serves; the overhead
    is per GPU). A model with fewer KV heads than GPUs keeps a whole head per GPU."""
    kv_share = min(tensor_parallel, ck.kv_heads)
    need = (weight_bytes(ck) / tensor_parallel + a.vllm_overhead_gib * GIB
            + sequences * max_model_len * kv_bytes_per_token(ck) / kv_share)
    return math.ceil(100 * need / (a.gpu_gib * GIB)) / 100


def feature_cache_bytes(n_memes: int, n_texts: int, seq_len: int, text_width: int, image_feat_dim: int,
                        image_emb_dim: int, token_fields: int = 2, store_bytes: int = 4, token_bytes: int = 8) -> int:
    """Host bytes of notebook 02's `lib.trace.features.FeatureCache`: float32 image features and embeddings per
    meme, the hidden states entering the lowest unfrozen text layer per distinct text (seq_len x
    width, in the cache's store dtype) and the int64 token tensors (ids, attention mask)."""
    return (n_memes * (image_feat_dim + image_emb_dim) * 4 + n_texts * seq_len * text_width * store_bytes
            + token_fields * n_texts * seq_len * token_bytes)


# ----------------------------------------------------------------------------- estimated: memory and time

def prefill_seconds(ck: Checkpoint, tokens: float, a: Assumptions) -> float:
    return 2 * ck.params_b * 1e9 * tokens / (a.peak_tflops * 1e12 * a.mfu_prefill)


def train_seconds(ck: Checkpoint, tokens: float, a: Assumptions) -> float:
    return 6 * ck.params_b * 1e9 * tokens / (a.peak_tflops * 1e12 * a.mfu_train)


def vllm_decode_seconds(ck: Checkpoint, tokens: float, a: Assumptions) -> float:
    return tokens / a.decode_batch * weight_bytes(ck) / (a.hbm_tb_s * 1e12)


def hf_decode_seconds(items: float, new_tokens: int, a: Assumptions) -> float:
    return items / a.hf_batch * new_tokens * a.hf_step_s


# ----------------------------------------------------------------------------- measured: committed GPU records

#: where measured GPU records are committed
MEASURED_DIR = Path(__file__).resolve().parents[2] / "results" / "gpu"


def _gpu_family(name: str) -> str:
    """"H100", "A100", ...: what a record's GPU and the table's GPU are matched on."""
    m = re.search(r"\b([A-Z]\d{2,3}[A-Z]?)\b", name)
    fam = m.group(1) if m else name
    variant = next((v for v in ("PCIe", "NVL") if v.lower() in name.lower()), "")   # H100 PCIe is not an SXM H100
    return f"{fam} {variant}".strip()


def measured_agent_training(gpu: str, batch: int, checkpointing: bool, folder: Path | None = None
                            ) -> dict[str, Any] | None:
    """The committed measurement of the agent recipe on `gpu`'s family closest to (batch, checkpointing): seconds
    per example, MFU when recorded, and where it comes from; None when no record measured it."""
    best = None
    for f in sorted((folder or MEASURED_DIR).glob("*.json")):
        try:
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        agent = rec.get("agent_training", rec if "runs" in rec and "what" in rec and "agent" in str(rec["what"]) else None)
        if not isinstance(agent, dict):
            continue
        device = str(agent.get("device") or rec.get("machine") or "")
        if _gpu_family(device) != _gpu_family(gpu):
            continue
        for r in agent.get("runs", []):
            if not r.get("s_per_example"):
                continue
            dist = (abs(int(r["batch_size"]) - batch), bool(r.get("gradient_checkpointing")) != checkpointing)
            if best is None or dist < best[0]:
                # the datasheet MFU; a record from before it has only the ratio to a measured matmul rate
                mfu = r.get("mfu") if "mfu_vs_measured_matmul" in r else None
                source = (f"{f.relative_to(MEASURED_DIR.parents[1]) if f.is_relative_to(MEASURED_DIR.parents[1]) else f}: "
                          f"{device}, torch {agent.get('torch') or rec.get('torch')}, {agent.get('date') or rec.get('date', '?')}"
                          + (f", commit {agent.get('commit') or rec.get('commit')}" if agent.get("commit") or rec.get("commit")
                             else ""))
                best = (dist, {"s_per_example": float(r["s_per_example"]), "mfu": mfu, "batch_size": int(r["batch_size"]),
                               "gradient_checkpointing": bool(r.get("gradient_checkpointing")), "source": source,
                               "what": agent.get("what") or rec.get("what", "")})
    return best[1] if best else None


def measured_part(gpu: str, part: str, folder: Path | None = None) -> tuple[dict[str, Any], str] | None:
    """The latest committed measurement (`--measure`'s record part: "generation", "clip4dm", "trace") on `gpu`'s
    family, and where it comes from (file, GPU, torch, date, commit); None when no record holds one."""
    found = []
    for f in sorted((folder or MEASURED_DIR).glob("*.json")):
        try:
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        p = rec.get(part)
        if isinstance(p, dict) and _gpu_family(str(p.get("device", ""))) == _gpu_family(gpu):
            root = MEASURED_DIR.parents[1]
            where = f.relative_to(root) if f.is_relative_to(root) else f
            found.append((str(p.get("date", "")), p, f"{where}: {p['device']}, torch {p.get('torch')}, {p.get('date', '?')}"
                          + (f", commit {p['commit']}" if p.get("commit") else "")))
    if not found:
        return None
    _, p, source = max(found, key=lambda x: x[0])
    return p, source


# ----------------------------------------------------------------------------- the table

@dataclass
class Row:
    stage: str
    work: str
    gpu_hours: float
    gpu_gib: float
    host_gib: float
    kind: str                 # exact | estimated | cited | none
    settings: str = ""


def few_shot_plan(section: dict[str, Any]) -> list[int]:
    """Shots per few-shot setting of notebook 04: every retriever x shots, then the controls."""
    n = [s for _ in section["retrievers"] for s in section["shots"]]
    return n + [int(c.get("n", 0)) for c in section["controls"].values()]


def vllm_settings(name: str, section: dict[str, Any], size: tuple[int, int], a: Assumptions,
                  sequences: int = 1, tensor_parallel: int = 1) -> dict[str, Any]:
    """The vLLM flags a served few-shot model needs for the profile's largest prompt, with KV
    for `sequences` prompts of that length (one longest prompt holds about two of the mean one)."""
    ck = CHECKPOINTS[name]
    tok = image_tokens(ck.image_rule, *size)
    longest = prompt_tokens(ck, max(section["shots"]), tok, a)
    mml = round_up(longest)
    return {"checkpoint": ck, "image_tokens": tok, "longest_prompt": longest, "max_model_len": mml,
            "images": max(section["shots"]) + 1, "tensor_parallel": tensor_parallel,
            "utilization": vllm_utilization(ck, mml, sequences, a, tensor_parallel)}


def cost_rows(profile: str = "paper", a: Assumptions | None = None) -> list[Row]:
    a = a or Assumptions()
    p = load_profile(profile)
    size, S = a.image_size, PAPER_SIZES
    rows: list[Row] = [Row("00 data", "checks and indexes the datasets", 0.0, 0.0, 2.0, "none")]

    ivl = CHECKPOINTS["internvl3.5-8b"]
    ivl_tok = image_tokens(ivl.image_rule, *size)
    memes = S["fhm"] + S["multioff"]
    cap_prompt = ivl_tok + 300
    cap_s = prefill_seconds(ivl, memes * cap_prompt, a) + hf_decode_seconds(memes, p["01_captioning"]["max_new_tokens"], a)
    kv = a.hf_batch * (cap_prompt + 100) * kv_bytes_per_token(ivl)
    gen = measured_part(a.gpu, "generation")
    cap_m = gen[0]["parts"].get("captioning") if gen else None
    if cap_m and cap_m.get("items_per_s"):
        cap_h, cap_kind = memes / cap_m["items_per_s"] / 3600 + 0.1, "measured"
        cap_note = (f"measured: {cap_m['items_per_s']:.2f} memes/s ({cap_m['what']}; {gen[1]}), plus 0.1 h estimated "
                    f"for GroundingDINO and the tagger; the estimate: {cap_s / 3600 + 0.1:.1f} GPU-hours")
    else:
        cap_h, cap_kind, cap_note = cap_s / 3600 + 0.1, "estimated", ""
    rows.append(Row("01 captioning", f"{memes:,} memes: InternVL3.5-8B (transformers, batch {a.hf_batch}), "
                    "GroundingDINO-base, CLIP L/14 tagger; Gemini through its API",
                    cap_h, (weight_bytes(ivl) + kv) / GIB + 3.0, 20.0, cap_kind, cap_note))

    sec2 = p["02_finetuning"]
    n_runs = (len(sec2["loss_configs"]) + len(sec2["baselines"]) + len(sec2["seeds"]) * len(sec2["seed_variants"])
              + len(sec2["backbones"]) - 1 + 2)
    caches = {b: feature_cache_bytes(S["fhm"], S["fhm"] * (1 + len(sec2["caption_columns"])), seq, width, img, emb)
              for b, (seq, width, img, emb) in {"clip-vit-l14": (77, 768, 1024, 768),
                                                "clip-xlmr-h14": (77, 1024, 1280, 1024),
                                                "siglip2-so400m": (64, 1152, 1152, 1152)}.items()}
    rows.append(Row("02 TRACE", f"{n_runs} runs (ablations, baselines, {len(sec2['seeds']) + 1} seeds of "
                    f"{len(sec2['seed_variants'])} variants, 3 backbones, MultiOFF) on cached features",
                    n_runs * a.trace_run_minutes / 60, 12.0, max(caches.values()) / GIB, "estimated",
                    "feature cache per backbone (float32, exact): " + ", ".join(
                        f"{b} {v / GIB:.1f} GiB" for b, v in caches.items())
                    + "; one backbone's cache at a time; `cache_dtype: bfloat16` halves it"))

    fps = dict(a.clip4dm_captions_per_s)
    c4 = measured_part(a.gpu, "clip4dm")
    c4_kind, c4_note = "cited", "the CLIP4DM paper's one-pair-at-a-time speed"
    if c4:
        for shape, key in (("B/32", "clip-vit-b32"), ("H/14", "clip-vit-h14")):
            best = max((r["from_files_pairs_per_s"] for r in c4[0].get("runs", []) if r.get("shape") == shape), default=None)
            if best:
                fps[key] = best
        if fps != dict(a.clip4dm_captions_per_s):
            c4_kind, c4_note = "measured", f"measured from image files on the production path ({c4[1]})"
    rows.append(Row("03 CLIP4DM", "per 10,000 captions: gradient attribution through the text encoder, "
                    f"B/32 {10_000 / fps['clip-vit-b32'] / 3600:.2f} h, H/14 {10_000 / fps['clip-vit-h14'] / 3600:.2f} h; "
                    "BART-MNLI for SeeTRUE", 10_000 / fps["clip-vit-h14"] / 3600, 8.0, 8.0, c4_kind, c4_note))

    sec4 = p["04_few_shot"]
    pg = CHECKPOINTS["paligemma-3b-pt-448"]
    rec = sec4["agent_recipe"]
    b, acc, ml = int(rec["batch_size"]), int(rec.get("grad_accum", 1)), int(rec["max_len"])
    ckpt = bool(rec.get("gradient_checkpointing", False))
    logit_tok = a.agent_answer_tokens + 1 if rec.get("answer_logits_only") else None
    # the recipe's attention: eager keeps the s x s scores per head, SDPA (the default) does not
    shape = replace(PALIGEMMA_TRAINING, eager_attention=rec.get("attn_implementation", "sdpa") == "eager")
    tr = step_bytes(shape, b, ml, ckpt, logit_tokens=logit_tok)
    smaller = settings_that_fit(shape, b, acc, ml, 48 * GIB, ckpt, logit_tokens=logit_tok)
    train_tok = S["agent_examples"] * int(rec["epochs"]) * (1024 + a.agent_answer_tokens)
    meas = measured_agent_training(a.gpu, b, ckpt)
    a_est = replace(a, mfu_train=meas["mfu"]) if meas and meas.get("mfu") else a
    est_h = train_seconds(pg, train_tok, a_est) / 3600
    if meas:
        hours = S["agent_examples"] * int(rec["epochs"]) * meas["s_per_example"] / 3600
        # a record of other settings (eager attention where the recipe asks for SDPA) is a measurement of them
        eager = "eager attention" in meas["what"]
        kind = "measured" if eager == shape.eager_attention else "measured, other settings"
        measured_note = (f"measured: {meas['s_per_example']:.2f} s per example at batch {meas['batch_size']}"
                         f"{' with' if meas['gradient_checkpointing'] else ' without'} checkpointing ({meas['source']}; "
                         f"{meas['what']}); the FLOP estimate at "
                         + (f"the measured MFU of {100 * meas['mfu']:.0f}%" if meas.get("mfu") else
                            f"an assumed {100 * a.mfu_train:.0f}% MFU") + f": {est_h:.1f} GPU-hours; ")
    else:
        hours, kind, measured_note = est_h, "estimated", ""
    rows.append(Row("04 agents: training", f"4 PaliGemma-3B-448 full fine-tunes, {S['agent_examples']:,} examples "
                    f"x {rec['epochs']} epochs, batch {b} x {ml} tokens"
                    f"{', gradient checkpointing' if ckpt else ''}{', logits of the answers only' if logit_tok else ''}"
                    f"{', eager attention' if shape.eager_attention else ', fused (SDPA) attention'}",
                    hours, tr["total"] / GIB, 24.0, kind, measured_note +
                    "memory estimated: " f"the larger of the forward/backward peak {tr['forward_backward'] / GIB:.1f} GiB (weights + Adam "
                    f"{tr['states'] / GIB:.1f}, activations {tr['activations'] / GIB:.1f}, logits {tr['logits'] / GIB:.1f}) "
                    f"and the optimizer step's {tr['optimizer_step'] / GIB:.1f} (weights, gradients, Adam's moments and "
                    f"the multi-tensor Adam's temporary; lib.models.train_memory; train_agent refuses a recipe that does not fit): "
                    f"train before any vLLM server starts"
                    + (f"; a 48 GB GPU: batch_size {smaller[0]['batch_size']}, grad_accum {smaller[0]['grad_accum']}"
                       f"{', gradient checkpointing' if smaller[0]['gradient_checkpointing'] else ''} "
                       f"({smaller[0]['gib']:.0f} GiB)" if smaller else "")))
    silver = (S["fhm_train"] + S["mami_train"]) * 3.5 + S["fhm_extended"] + S["mami_extended"]
    silver_h = hf_decode_seconds(silver, int(sec4["agent_max_new_tokens"]), a) / 3600
    sil_m = gen[0]["parts"].get("silver") if gen else None
    sil_kind, sil_note = "estimated", ""
    if sil_m and sil_m.get("items_per_s"):
        sil_kind, sil_note = "measured", (f"measured: {sil_m['items_per_s']:.2f} generations/s ({sil_m['what']}; "
                                          f"{gen[1]}); the estimate: {silver_h:.1f} GPU-hours")
        silver_h = silver / sil_m["items_per_s"] / 3600
    rows.append(Row("04 agents: silver texts", f"up to {silver:,.0f} generations (exemplar pools' captions, "
                    "explanations, interventions; the queries' captions), transformers batch "
                    f"{a.hf_batch}", silver_h,
                    (weight_bytes(pg) + a.hf_batch * 1300 * kv_bytes_per_token(pg)) / GIB + 2.0, 8.0, sil_kind, sil_note))

    plan = few_shot_plan(sec4)
    queries = S["fhm_extended"] + S["mami_extended"]
    served = [m for m in sec4["models"] if m.startswith("vllm-")]
    total_util, utils = 0.0, []
    for m in served:
        name = m.removeprefix("vllm-")
        v = vllm_settings(name, sec4, size, a)
        ck, tok = v["checkpoint"], v["image_tokens"]
        toks = sum(prompt_tokens(ck, n, tok, a) for n in plan) * queries
        secs = prefill_seconds(ck, toks, a) + vllm_decode_seconds(ck, len(plan) * queries * a.answer_tokens, a)
        total_util += v["utilization"]
        utils.append(f"{name} {v['utilization']:.2f}")
        rows.append(Row(f"04 few-shot: {name}", f"{queries:,} memes x {len(plan)} settings (mean "
                        f"{sum(plan) / len(plan):.1f} shots), {tok:,} tokens per image",
                        secs / 3600, v["utilization"] * a.gpu_gib, 6.0, "estimated",
                        f"--max-model-len {v['max_model_len']} (longest prompt {v['longest_prompt']:,} tokens: "
                        "images counted, text assumed) "
                        f"--limit-mm-per-prompt '{{\"image\": {v['images']}}}' "
                        f"--gpu-memory-utilization {v['utilization']:.2f}"))
    if len(served) > 1:
        rows[-1].settings += (f"; both servers at once: {' + '.join(utils)} = {total_util:.2f} of the GPU, "
                              f"leaving {(1 - total_util) * a.gpu_gib:.0f} GiB: the agents' generation fits beside "
                              "them, their training does not")
    sec5 = p["05_debate"]
    rows.append(Row("05 debate", f"{S['hvli_test']:,} H-VLI posts x 3 variants through {sec5['chat_preset']} (API)",
                    0.0, 0.0, 2.0, "none", "with vllm-internvl3.5-8b instead: the server of notebook 04"))
    common = S["hvli_test"]
    calls6 = common * len(p["06_evaluation"]["fewshot_settings"]) + common // 2 * 5 * 3
    v = vllm_settings("internvl3.5-8b", sec4, size, a)
    per_call = prefill_seconds(ivl, prompt_tokens(ivl, 4, v["image_tokens"], a), a)
    rows.append(Row("06 evaluation", f"about {calls6:,} few-shot calls on the common memes and their injected "
                    "copies (the court's through its API); TRACE inference", calls6 * per_call / 3600 + 0.1,
                    v["utilization"] * a.gpu_gib, 8.0, "estimated", "the servers of notebook 04"))
    rows.append(Row("07 figures", "drawn from artifacts", 0.0, 0.0, 2.0, "none"))
    return rows


def markdown(rows: Sequence[Row], a: Assumptions) -> str:
    out = [f"| stage | work | GPU-hours | GPU memory (GiB) | host memory (GiB) | kind | settings that fit one {a.gpu} |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        hours = "0" if r.gpu_hours == 0 else f"{r.gpu_hours:.1f}" if r.gpu_hours >= 0.1 else "< 0.1"
        out.append(f"| {r.stage} | {r.work} | {hours} | {r.gpu_gib:.0f} | {r.host_gib:.0f} | {r.kind} | {r.settings} |")
    return "\n".join(out)


def measured_size(folder: Path, limit: int = 2000) -> tuple[int, int]:
    """The 90th-percentile width and height of up to `limit` images in `folder` (headers only)."""
    from PIL import Image                                   # lazy: only with --images
    sizes = []
    for f in sorted(folder.iterdir())[:limit]:
        if f.suffix.lower() in {".png", ".jpg", ".jpeg", ".webp"}:
            with Image.open(f) as im:
                sizes.append(im.size)
    if not sizes:
        raise FileNotFoundError(f"{folder}: no .png/.jpg/.jpeg/.webp image to measure")
    q = sorted(w * h for w, h in sizes)[int(0.9 * (len(sizes) - 1))]
    return next((w, h) for w, h in sizes if w * h == q)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--image-size", default=None, help="WIDTHxHEIGHT of a typical meme (default 1000x1000)")
    ap.add_argument("--images", type=Path, default=None, help="a folder of memes: their 90th-percentile size is used")
    ap.add_argument("--gpu-gib", type=float, default=None)
    ap.add_argument("--measure", action="store_true", help="measure the agent recipe, CLIP4DM and TRACE on the visible "
                    "GPU (lib.compendium.measure: random weights of the full shapes; writes artifacts/measured/<gpu>.json)")
    ap.add_argument("--only", default=None, help="with --measure: some of agent_training, clip4dm, trace, generation "
                    "(comma-separated); the others already in the record are kept")
    ap.add_argument("--toy", action="store_true", help="with --measure: the same code at a tiny shape (CPU is fine)")
    ap.add_argument("--vllm-url", default=None, help="with --measure: a vLLM server on this GPU for the few-shot part")
    ap.add_argument("--vllm-model", default=None, help="with --measure: the served model's name at --vllm-url")
    args = ap.parse_args(argv)
    if args.measure:
        from lib.compendium import measure                  # lazy: it builds models, which the estimates never need
        parts = ("agent_training", "clip4dm", "trace", "generation")
        only = tuple(x.strip() for x in args.only.split(",")) if args.only else parts
        if set(only) - set(parts):
            print(f"error: --only takes {', '.join(parts)}; got {', '.join(sorted(set(only) - set(parts)))}",
                  file=sys.stderr)
            return 2
        path = measure.measure(toy=args.toy, only=only, profile=args.profile, vllm_url=args.vllm_url,
                               vllm_model=args.vllm_model)
        print(measure.markdown(json.loads(path.read_text())) + f"\n\nwritten: {path}")
        return 0
    a = Assumptions()
    if args.images:
        a = replace(a, image_size=measured_size(args.images))
    elif args.image_size:
        w, h = (int(x) for x in args.image_size.lower().split("x"))
        a = replace(a, image_size=(w, h))
    if args.gpu_gib:
        a = replace(a, gpu_gib=args.gpu_gib)
    rows = cost_rows(args.profile, a)
    print(f"profile {args.profile}; memes of {a.image_size[0]}x{a.image_size[1]} px; {a.gpu}\n")
    print(markdown(rows, a))
    print(f"\ntotal: {sum(r.gpu_hours for r in rows):.0f} GPU-hours (estimated)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
