"""Embedded models trained by the compendium on MemeWorld, saved in Hugging Face format.

memeworld-clip: a small model of the Hugging Face CLIP architecture (eager attention
available, so CLIP4DM's attention gradients work), with a Hugging Face CLIP tokenizer
built offline from the BPE vocabulary that open_clip ships. It is trained
contrastively on MemeWorld scene captions, each batch also holding one FOIL caption
per image as a hard negative (as NegCLIP does), and is evaluated on held-out test
memes: FOIL pair accuracy (true caption scored above its one-word foil) and
image-to-text retrieval R@1.

MemeWorld's scenes are few enough that a training meme can share its caption with a test
meme, and the FOIL generator that makes the hard negatives also makes the test foils: a third of
the training pairs (2,295 of 7,055 in the embedded world) carry a caption or foil that a test
benchmark scores (FOIL, nocaps-FOIL, HAT, RichHF or SeeTRUE). The main
model keeps them (every later stage is built on it); the two models of the hard-negative
ablation (`ClipConfig.leak_free`) drop every such pair, one with and one without the hard
negatives, so that notebook 03's F-CLIPScore ablation is measured on captions neither saw.

The saved folder loads with `transformers.CLIPModel.from_pretrained` and
`AutoTokenizer.from_pretrained` / `CLIPImageProcessor.from_pretrained`, exactly as a hub
checkpoint does.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from lib.compendium.artifacts import (read_jsonl, code_digest, file_digest, require, stage_dir, write_json, write_manifest,
                                      write_metrics, write_with)
from lib.models.memeworld_vlm import VlmConfig, fit, train_memeworld_vlm
from lib.compendium.artifacts import save_weights
from lib.models.nli import NliConfig, train_memeworld_nli
from lib.compendium.params import validate_profile
from lib.evaluation.plotting import save_figure, setup

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class ClipConfig:
    """memeworld-clip: architecture and training recipe (CPU, a few minutes)."""
    image_size: int = 64          # input side; MemeWorld renders 128 px and is resized
    patch_size: int = 16
    width: int = 96               # hidden size of both towers
    layers: int = 3               # transformer layers per tower
    heads: int = 4
    projection_dim: int = 64
    epochs: int = 12              # 12 epochs: ~170 s on 2 cores, FOIL pair accuracy ~0.96
    batch_size: int = 128
    lr: float = 2e-3              # peak of a one-cycle schedule
    weight_decay: float = 0.1
    hard_negatives: bool = True   # one FOIL caption per image in every batch
    leak_free: bool = False       # drop training pairs whose caption or foil is a test benchmark's caption
    seed: int = 0
    threads: int = 2
    eval_pairs: int = 2000        # held-out test memes for FOIL accuracy and R@1


# ----------------------------------------------------------------------------- tokenizer
def build_clip_tokenizer():
    """A Hugging Face CLIPTokenizer equal to open_clip's BPE tokenizer, built offline.

    open_clip names the special tokens <start_of_text> / <end_of_text>; Hugging Face
    expects <|startoftext|> / <|endoftext|>, so they are renamed with their ids kept.
    """
    from open_clip import tokenizer as oc_tok
    from transformers import CLIPTokenizer
    simple = oc_tok.SimpleTokenizer()
    vocab = dict(simple.encoder)
    vocab["<|startoftext|>"] = vocab.pop("<start_of_text>")
    vocab["<|endoftext|>"] = vocab.pop("<end_of_text>")
    merges = [tuple(pair) for pair, _ in sorted(simple.bpe_ranks.items(), key=lambda kv: kv[1])]
    tok = CLIPTokenizer(vocab=vocab, merges=merges)
    tok.model_max_length = 77
    return tok


def clip_config(cfg: ClipConfig, vocab_size: int = 49408):
    from transformers import CLIPConfig
    return CLIPConfig(
        text_config=dict(vocab_size=vocab_size, hidden_size=cfg.width, intermediate_size=4 * cfg.width,
                         num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, max_position_embeddings=77,
                         bos_token_id=49406, eos_token_id=49407, pad_token_id=49407),
        vision_config=dict(image_size=cfg.image_size, patch_size=cfg.patch_size, hidden_size=cfg.width,
                           intermediate_size=4 * cfg.width, num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads),
        projection_dim=cfg.projection_dim)


def image_processor(cfg: ClipConfig):
    from transformers import CLIPImageProcessor
    return CLIPImageProcessor(size={"shortest_edge": cfg.image_size},
                              crop_size={"height": cfg.image_size, "width": cfg.image_size},
                              image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD))


# ----------------------------------------------------------------------------- data
def _load_images(root: Path, rels: list[str], size: int):
    """uint8 tensor [N, 3, size, size] of the images, resized as CLIPImageProcessor would."""
    import torch
    arr = np.stack([np.asarray(Image.open(root / r).convert("RGB").resize((size, size), Image.BICUBIC))
                    for r in rels])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()


def _normalise(x):
    import torch
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return (x.float() / 255.0 - mean) / std


def _features(out):
    """transformers 5 returns a model output from get_*_features; older versions a tensor."""
    return out.pooler_output if hasattr(out, "pooler_output") else out


# ----------------------------------------------------------------------------- training
def train_memeworld_clip(memeworld: Path | str, out_dir: Path | str, cfg: ClipConfig = ClipConfig(),
                         progress: bool = True) -> dict[str, Any]:
    """Train memeworld-clip on MemeWorld's scene captions; save it; return its metrics and curve."""
    import torch
    import torch.nn.functional as F
    from transformers import CLIPModel
    memeworld, out_dir = Path(memeworld), Path(out_dir)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tok = build_clip_tokenizer()
    rows = read_jsonl(memeworld / "captions" / "scene_captions.jsonl")
    rows = [r for r in rows if r["split"] == "train"]
    test = test_captions(memeworld)
    n_all = len(rows)
    if cfg.leak_free:
        rows = [r for r in rows if r["caption"] not in test and r["foil"] not in test]
    leaking = sum(r["caption"] in test or (cfg.hard_negatives and r["foil"] in test) for r in rows)
    X = _load_images(memeworld, [r["img"] for r in rows], cfg.image_size)
    caps, foils = [r["caption"] for r in rows], [r["foil"] for r in rows]
    # tokenised once, padded per batch: the same tensors as tokenising each batch with padding
    cap_ids, foil_ids = tok(caps)["input_ids"], tok(foils)["input_ids"]
    model = CLIPModel(clip_config(cfg, len(tok)))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = len(rows) // cfg.batch_size
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.epochs * steps_per_epoch,
                                                pct_start=0.1)
    model.train()

    def losses(epoch: int):
        perm = torch.randperm(len(rows))
        for s in range(steps_per_epoch):
            idx = perm[s * cfg.batch_size:(s + 1) * cfg.batch_size].tolist()
            seqs = [cap_ids[j] for j in idx] + ([foil_ids[j] for j in idx] if cfg.hard_negatives else [])
            input_ids, attention_mask = pad_batch(seqs, tok.pad_token_id)
            out = model(input_ids=input_ids, attention_mask=attention_mask, pixel_values=_normalise(X[idx]))
            target = torch.arange(len(idx))
            # image -> text over true captions and foils; text -> image over true captions only
            yield 0.5 * (F.cross_entropy(out.logits_per_image, target)
                         + F.cross_entropy(out.logits_per_text[:len(idx)], target))
    curve, train_s = fit(model, opt, sched, cfg.epochs, cfg.epochs * steps_per_epoch, losses, "train memeworld-clip",
                         progress)
    model.eval()
    metrics = evaluate_clip(model, tok, memeworld, cfg)
    metrics.update({"clip_train_s": train_s, "clip_train_pairs": len(rows), "clip_train_pairs_dropped": n_all - len(rows),
                    "clip_train_pairs_with_test_caption": leaking})
    out_dir.mkdir(parents=True, exist_ok=True)
    write_with(out_dir / "model.safetensors", lambda p: save_weights(model, p))
    model.config.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    image_processor(cfg).save_pretrained(out_dir)
    write_json(out_dir / "training.json", {"config": asdict(cfg), "curve": curve, "metrics": metrics})
    return {"metrics": metrics, "curve": curve}


def pad_batch(seqs: list[list[int]], pad_id: int):
    """Token id lists -> (input_ids, attention_mask) padded on the right to the longest, as the
    tokenizer's `padding=True` does."""
    import torch
    n = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, :len(q)] = torch.tensor(q)
        mask[i, :len(q)] = 1
    return ids, mask


def test_captions(memeworld: Path | str) -> set[str]:
    """Every caption a misalignment benchmark scores (FOIL, nocaps-FOIL, HAT, RichHF, SeeTRUE):
    what a leak-free model must never train on, as a caption or as a hard negative."""
    memeworld = Path(memeworld)
    foil = json.loads((memeworld / "foil" / "foil_test.json").read_text())
    caps = {a["caption"] for a in foil["annotations"]}
    for it in json.loads((memeworld / "nocaps_foil" / "nocaps_foil.json").read_text()):
        caps |= {it["foil"], it["baseline"]}
    caps |= {r["caption"] for r in json.loads((memeworld / "hat" / "hat.json").read_text())}
    caps |= {r["prompt"] for r in read_jsonl(memeworld / "richhf" / "richhf.jsonl")}
    caps |= {r["image_caption"] for r in json.loads((memeworld / "seetrue" / "seetrue_feedback.json").read_text())}
    return caps


def evaluate_clip(model, tok, memeworld: Path, cfg: ClipConfig) -> dict[str, float]:
    """FOIL pair accuracy and image-to-text R@1 on held-out MemeWorld test memes."""
    import torch
    import torch.nn.functional as F
    data = json.loads((memeworld / "foil" / "foil_test.json").read_text())
    files = {im["id"]: im["file_name"] for im in data["images"]}
    by: dict[Any, dict[str, str]] = {}
    for a in data["annotations"]:
        by.setdefault(a["image_id"], {})["foil" if a["foil"] else "orig"] = a["caption"]
    ids = [i for i in by if len(by[i]) == 2][: cfg.eval_pairs]
    with torch.no_grad():
        X = _normalise(_load_images(memeworld, [f"img/{files[i]}" for i in ids], cfg.image_size))
        img = torch.cat([_features(model.get_image_features(pixel_values=X[k:k + 256])) for k in range(0, len(ids), 256)])
        img = F.normalize(img, dim=-1)

        def text(txts):
            outs = []
            for k in range(0, len(txts), 256):
                enc = tok(txts[k:k + 256], padding=True, return_tensors="pt")
                outs.append(_features(model.get_text_features(input_ids=enc["input_ids"],
                                                              attention_mask=enc["attention_mask"])))
            return F.normalize(torch.cat(outs), dim=-1)
        orig, foil = text([by[i]["orig"] for i in ids]), text([by[i]["foil"] for i in ids])
        pair_acc = ((img * orig).sum(-1) > (img * foil).sum(-1)).float().mean().item()
        r1 = ((img @ orig.T).argmax(-1) == torch.arange(len(ids))).float().mean().item()
    return {"clip_foil_pair_acc": pair_acc, "clip_retrieval_r1": r1, "clip_eval_pairs": len(ids),
            "clip_retrieval_chance": 1.0 / max(1, len(ids))}


# ----------------------------------------------------------------------------- the `models` stage
@dataclass
class Config:
    """Parameters of the `models` stage (params/<profile>.yaml, section `models`)."""
    train: bool = True            # embedded: train memeworld-clip and memeworld-vlm; paper: hub checkpoints
    clip_epochs: int = 12
    vlm_epochs: int = 3
    vlm_eval_n: int = 300         # held-out memes captioned for ROUGE-L
    ablation_epochs: int = 12     # the hard-negative ablation's two leak-free CLIPs (0: not trained)
    nli_epochs: int = 1           # memeworld-nli, SeeTRUE's NLI scorer (0: not trained)
    nli_train_memes: int = 1000   # training memes that give memeworld-nli its pairs (two per meme)
    seed: int = 0


STAGE = "models"


#: the modules each kind of model depends on (a change to their rules retrains that kind; moving code,
#: comments or imports does not: `artifacts.code_digest`)
CODE_OF = {"clip": ("lib.models.embedded",), "vlm": ("lib.models.embedded", "lib.models.memeworld_vlm"),
           "nli": ("lib.models.nli",)}


def _code_digest(kind: str) -> str:
    return code_digest(*(importlib.import_module(m) for m in CODE_OF[kind]))[:16]


def _cache_key(kind: str, cfg: Any, memeworld: Path, extra: str = "") -> str:
    """What a trained model depends on: its config, the code, MemeWorld's generator parameters."""
    blob = json.dumps({"kind": kind, "config": asdict(cfg), "code": _code_digest(kind),
                       "memeworld": file_digest(memeworld / "params.json"), "extra": extra}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _model_files(out_dir: Path) -> dict[str, str]:
    """Every file of a model folder but its training.json, with its digest."""
    return {p.relative_to(out_dir).as_posix(): file_digest(p) for p in sorted(out_dir.rglob("*"))
            if p.is_file() and p.name != "training.json"}


def _cached(out_dir: Path, key: str) -> dict[str, Any] | None:
    """The saved training record when the folder holds the model trained under `key`: the key and
    the digest of every file must match what the stamp recorded (a folder left half-replaced by a
    killed run, or edited since, is trained again)."""
    p = out_dir / "training.json"
    if not p.exists():
        return None
    try:
        saved = json.loads(p.read_text())
    except ValueError:
        return None
    if saved.get("cache_key") != key or saved.get("files") != _model_files(out_dir):
        return None
    return saved


def _stamp(out_dir: Path, key: str) -> dict[str, Any]:
    """Record the key and the files' digests in training.json, written last (atomically)."""
    saved = json.loads((out_dir / "training.json").read_text())
    saved["cache_key"] = key
    saved["files"] = _model_files(out_dir)
    write_json(out_dir / "training.json", saved)
    return saved


def train_all(profile: str, params: Config, progress: bool = True) -> dict[str, Any]:
    """Train (or reuse) both embedded models; write metrics.json, the curve figure and models.json."""
    memeworld = require(profile, "memeworld", f"stage '{STAGE}'")
    out = stage_dir(profile, STAGE)
    ccfg = ClipConfig(epochs=params.clip_epochs, seed=params.seed)
    clip_dir = out / "memeworld-clip"
    ckey = _cache_key("clip", ccfg, memeworld)
    clip = _cached(clip_dir, ckey)
    if clip is None:
        train_memeworld_clip(memeworld, clip_dir, ccfg, progress=progress)
        clip = _stamp(clip_dir, ckey)
    else:
        print(f"memeworld-clip: cached ({clip_dir.relative_to(out.parent.parent.parent)}, key {ckey})")
    vcfg = VlmConfig(epochs=params.vlm_epochs, eval_n=params.vlm_eval_n, seed=params.seed)
    vlm_dir = out / "memeworld-vlm"
    vkey = _cache_key("vlm", vcfg, memeworld, extra=ckey)   # the VLM starts from the CLIP vision tower
    vlm = _cached(vlm_dir, vkey)
    if vlm is None:
        train_memeworld_vlm(memeworld, clip_dir, vlm_dir, vcfg, progress=progress)
        vlm = _stamp(vlm_dir, vkey)
    else:
        print(f"memeworld-vlm: cached (key {vkey})")
    side = train_side_models(memeworld, out, params, progress=progress)
    ablation = {k: v for k, v in side.items() if k in ABLATION_MODELS}
    cm, vm = clip["metrics"], vlm["metrics"]
    metrics = {k: cm[k] for k in ("clip_foil_pair_acc", "clip_retrieval_r1", "clip_retrieval_chance",
                                  "clip_eval_pairs", "clip_train_s", "clip_train_pairs",
                                  "clip_train_pairs_with_test_caption")}
    metrics.update({k: vm[k] for k in ("vlm_rouge_l", "vlm_rouge_l_baseline", "vlm_exact_match", "vlm_eval_n",
                                       "vlm_train_s")})
    for name, saved in ablation.items():
        tag = ABLATION_TAGS[name]
        metrics.update({f"{k}_{tag}": saved["metrics"][k] for k in
                        ("clip_foil_pair_acc", "clip_retrieval_r1", "clip_train_s", "clip_train_pairs",
                         "clip_train_pairs_with_test_caption")})
    if NLI_MODEL in side:
        metrics.update({k: side[NLI_MODEL]["metrics"][k] for k in ("nli_heldout_acc", "nli_heldout_majority",
                                                                  "nli_heldout_pairs", "nli_train_s")})
    write_metrics(profile, STAGE, metrics)
    models = {
        "memeworld-clip": {"path": "memeworld-clip", "preset": "memeworld-clip", "cache_key": ckey,
                           "config": clip["config"]},
        "memeworld-vlm": {"path": "memeworld-vlm", "preset": "memeworld-vlm", "cache_key": vkey,
                          "config": vlm["config"], "examples": vm.get("vlm_examples", [])}}
    models.update({name: {"path": name, "preset": name if name in ABLATION_MODELS else None,
                          "cache_key": saved["cache_key"], "config": saved["config"]} for name, saved in side.items()})
    write_json(out / "models.json", models)
    figure(clip["curve"], vlm["curve"], metrics, profile)
    write_manifest(out, asdict(params), outputs=["memeworld-clip", "memeworld-vlm", *side, "metrics.json",
                                                 "models.json"],
                   inputs={"memeworld": "00_data_prep/memeworld"})
    return metrics


#: the hard-negative ablation's models (notebook 03): both leak-free, one trained with FOIL hard
#: negatives and one without; metric suffixes in models/metrics.json
ABLATION_MODELS = {"memeworld-clip-leakfree": True, "memeworld-clip-leakfree-nohn": False}
ABLATION_TAGS = {"memeworld-clip-leakfree": "leak_free", "memeworld-clip-leakfree-nohn": "leak_free_no_hard_negatives"}


NLI_MODEL = "memeworld-nli"


def _train_one(args: tuple[str, str, str, dict[str, Any]]) -> str:
    kind, memeworld, out_dir, cfg = args
    if kind == "nli":
        train_memeworld_nli(memeworld, out_dir, NliConfig(**cfg), progress=False)
    else:
        train_memeworld_clip(memeworld, out_dir, ClipConfig(**cfg), progress=False)
    return out_dir


def train_side_models(memeworld: Path, out: Path, params: Config, progress: bool = True) -> dict[str, dict[str, Any]]:
    """The models notebook 03 needs beside memeworld-clip: the hard-negative ablation's two
    leak-free CLIPs and memeworld-nli (SeeTRUE's NLI scorer), trained (or reused) two at a time in
    single-thread processes (on 2 cores, faster than one after the other with two threads each)."""
    wanted: list[tuple[str, str, Any]] = []
    if params.ablation_epochs:
        wanted += [("clip", name, ClipConfig(epochs=params.ablation_epochs, seed=params.seed, hard_negatives=hard,
                                             leak_free=True, threads=1)) for name, hard in ABLATION_MODELS.items()]
    if params.nli_epochs:
        wanted.append(("nli", NLI_MODEL, NliConfig(epochs=params.nli_epochs, train_memes=params.nli_train_memes,
                                                         seed=params.seed, threads=1)))
    todo, saved = [], {}
    for kind, name, cfg in wanted:
        key = _cache_key(kind, cfg, memeworld)
        hit = _cached(out / name, key)
        if hit is None:
            todo.append((kind, name, cfg, key))
        else:
            print(f"{name}: cached (key {key})")
            saved[name] = hit
    if todo:
        jobs = [(kind, str(memeworld), str(out / name), asdict(cfg)) for kind, name, cfg, _ in todo]
        with ProcessPoolExecutor(min(2, len(jobs)), mp_context=mp.get_context("spawn")) as ex:
            list(tqdm(ex.map(_train_one, jobs), total=len(jobs), desc="ablation CLIPs and memeworld-nli",
                      disable=not progress))
        for _, name, _, key in todo:
            saved[name] = _stamp(out / name, key)
    return {name: saved[name] for _, name, _ in wanted}


def curve_figure(clip_curve, vlm_curve, metrics: dict[str, Any], profile: str):
    """The two models' training loss with their held-out figures (lib.evaluation.figures redraws it from training.json)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, curve, title, note in (
            (axes[0], clip_curve, "memeworld-clip (contrastive + FOIL negatives)",
             f"held-out FOIL pair acc {metrics['clip_foil_pair_acc']:.3f}, R@1 {metrics['clip_retrieval_r1']:.3f}"),
            (axes[1], vlm_curve, "memeworld-vlm (captioning)",
             f"held-out ROUGE-L {metrics['vlm_rouge_l']:.3f} (1-caption baseline {metrics['vlm_rouge_l_baseline']:.3f})")):
        ax.plot([c["epoch"] for c in curve], [c["loss"] for c in curve], marker="o")
        ax.set(title=title, xlabel="epoch", ylabel="training loss")
        ax.text(0.98, 0.95, note, transform=ax.transAxes, ha="right", va="top", fontsize=8)
    fig.suptitle(f"Embedded models trained on MemeWorld (profile {profile}, CPU)", fontsize=10)
    return fig


def figure(clip_curve, vlm_curve, metrics: dict[str, Any], profile: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    setup()
    fig = curve_figure(clip_curve, vlm_curve, metrics, profile)
    save_figure(fig, "models_training_curves", profile)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Train (or reuse) the embedded models: memeworld-clip, memeworld-vlm.")
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    section = validate_profile(args.profile)[STAGE]
    params = Config(**section)
    if not params.train:
        out = stage_dir(args.profile, STAGE)
        write_json(out / "models.json", {"note": "profile uses hub checkpoints named by presets; nothing trained"})
        write_metrics(args.profile, STAGE, {"models_trained": 0})          # what this run did: nothing to train
        write_manifest(out, asdict(params), outputs=["models.json", "metrics.json"])
        print(f"profile {args.profile}: models come from hub presets (params/presets/); nothing to train")
        return 0
    metrics = train_all(args.profile, params, progress=not args.no_progress)
    for k, v in metrics.items():
        print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
