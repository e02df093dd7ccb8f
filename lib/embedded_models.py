"""Embedded models trained by the compendium on MemeWorld, saved in Hugging Face format.

memeworld-clip: a small model of the Hugging Face CLIP architecture (eager attention
available, so CLIP4DM's attention gradients work), with a Hugging Face CLIP tokenizer
built offline from the BPE vocabulary that open_clip ships. It is trained
contrastively on MemeWorld scene captions, each batch also holding one FOIL caption
per image as a hard negative (as NegCLIP does), and is evaluated on held-out test
memes: FOIL pair accuracy (true caption scored above its one-word foil) and
image-to-text retrieval R@1.

The saved folder loads with `transformers.CLIPModel.from_pretrained` and
`AutoTokenizer.from_pretrained` / `CLIPImageProcessor.from_pretrained`, exactly as a hub
checkpoint does.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lib.artifacts import write_json, write_with

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
    from PIL import Image
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
    from tqdm.auto import tqdm
    from transformers import CLIPModel
    memeworld, out_dir = Path(memeworld), Path(out_dir)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tok = build_clip_tokenizer()
    rows = [json.loads(l) for l in (memeworld / "captions" / "scene_captions.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["split"] == "train"]
    X = _load_images(memeworld, [r["img"] for r in rows], cfg.image_size)
    caps, foils = [r["caption"] for r in rows], [r["foil"] for r in rows]
    model = CLIPModel(clip_config(cfg, len(tok)))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = len(rows) // cfg.batch_size
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.epochs * steps_per_epoch,
                                                pct_start=0.1)
    curve, t0 = [], time.time()
    bar = tqdm(total=cfg.epochs * steps_per_epoch, desc="train memeworld-clip", disable=not progress)
    model.train()
    for epoch in range(cfg.epochs):
        perm = torch.randperm(len(rows))
        losses = []
        for s in range(steps_per_epoch):
            idx = perm[s * cfg.batch_size:(s + 1) * cfg.batch_size].tolist()
            texts = [caps[j] for j in idx] + ([foils[j] for j in idx] if cfg.hard_negatives else [])
            enc = tok(texts, padding=True, return_tensors="pt")
            out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                        pixel_values=_normalise(X[idx]))
            target = torch.arange(len(idx))
            # image -> text over true captions and foils; text -> image over true captions only
            loss = 0.5 * (F.cross_entropy(out.logits_per_image, target)
                          + F.cross_entropy(out.logits_per_text[:len(idx)], target))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.update(1)
        curve.append({"epoch": epoch + 1, "loss": float(np.mean(losses)), "seconds": time.time() - t0})
    bar.close()
    train_s = time.time() - t0
    model.eval()
    metrics = evaluate_clip(model, tok, memeworld, cfg)
    metrics["clip_train_s"] = train_s
    out_dir.mkdir(parents=True, exist_ok=True)
    write_with(out_dir / "model.safetensors", lambda p: _save_weights(model, p))
    model.config.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    image_processor(cfg).save_pretrained(out_dir)
    write_json(out_dir / "training.json", {"config": asdict(cfg), "curve": curve, "metrics": metrics})
    return {"metrics": metrics, "curve": curve}


def _save_weights(model, path: Path) -> None:
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})


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
