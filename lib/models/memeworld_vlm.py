"""memeworld-vlm: a small LLaVA-architecture image-text-to-text model trained on MemeWorld.

Architecture (transformers `LlavaForConditionalGeneration`, the recipe of LLaVA itself):
a CLIP vision tower initialised from memeworld-clip's vision tower, a two-layer MLP
projector, and a small Llama language model, with its own byte-level BPE tokenizer trained
on MemeWorld's text and a chat template. Trained (all of it, on CPU) to caption MemeWorld
images with their gold scene captions; held-out quality is ROUGE-L against the gold
captions, reported beside a one-caption baseline (the most frequent training caption).

The saved folder loads with `AutoModelForImageTextToText.from_pretrained` and
`AutoProcessor.from_pretrained` and is driven through `lib.models.chat.HFChatBackend`, exactly
as InternVL or PaliGemma checkpoints are.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from lib.compendium.prompts import prompt_line
from lib.evaluation.textmetrics import rouge_l
from lib.compendium.artifacts import read_jsonl, save_model

CAPTION_PROMPT = prompt_line("caption/describe.txt")   # the question memeworld-vlm is trained on
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>", "<image>"]

#: USER/ASSISTANT turns, images as <image> placeholders, system text first. The processor
#: expands each <image> into the vision tower's patch tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}SYSTEM: {% elif m['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{{ '\n' }}{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


@dataclass
class VlmConfig:
    """memeworld-vlm: architecture and training recipe (CPU, a few minutes)."""
    vocab_size: int = 1024        # byte-level BPE trained on MemeWorld text
    hidden: int = 192             # Llama hidden size
    layers: int = 3
    heads: int = 4
    intermediate: int = 512
    epochs: int = 3
    batch_size: int = 64
    lr: float = 1.5e-3
    weight_decay: float = 0.05
    vision_lr_scale: float = 0.3  # the pretrained vision tower learns more slowly
    seed: int = 0
    threads: int = 2
    eval_n: int = 300             # held-out test memes captioned for ROUGE-L
    max_new_tokens: int = 40


def memeworld_texts(memeworld: Path) -> list[str]:
    """The text the tokenizer learns from, read from two named files only (a new view of MemeWorld
    must never change the model): every meme's text, gold caption and reasons (memeworld.jsonl),
    the training pairs' FOIL captions (captions/scene_captions.jsonl), and the captioning prompt."""
    out = [CAPTION_PROMPT]
    for r in read_jsonl(memeworld / "memeworld.jsonl"):
        out += [r["text"], r["gold_caption"], r.get("text_reason") or "", r.get("image_reason") or "",
                r.get("final_reason") or ""]
    out += [r["foil"] for r in read_jsonl(memeworld / "captions" / "scene_captions.jsonl")]
    return [t for t in out if t]


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE over MemeWorld text, wrapped as a Hugging Face fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", extra_special_tokens={"image_token": "<image>"})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_vlm(tok, clip_dir: Path, cfg: VlmConfig):
    """LlavaForConditionalGeneration + LlavaProcessor, vision tower copied from memeworld-clip."""
    import torch
    from transformers import (CLIPImageProcessor, CLIPModel, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor)
    clip = CLIPModel.from_pretrained(clip_dir)
    vc = clip.config.vision_config
    tc = LlamaConfig(vocab_size=len(tok), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                     num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
                     max_position_embeddings=256, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    n_patches = (vc.image_size // vc.patch_size) ** 2
    config = LlavaConfig(vision_config=vc.to_dict(), text_config=tc.to_dict(),
                         image_token_index=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-1,
                         vision_feature_select_strategy="default", projector_hidden_act="gelu",
                         image_seq_length=n_patches)
    config.vision_config.model_type = "clip_vision_model"
    torch.manual_seed(cfg.seed)
    model = LlavaForConditionalGeneration(config)
    tower = model.model.vision_tower
    getattr(tower, "vision_model", tower).load_state_dict(clip.vision_model.state_dict())
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    ip = CLIPImageProcessor.from_pretrained(clip_dir)
    proc = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=vc.patch_size,
                          vision_feature_select_strategy="default", chat_template=CHAT_TEMPLATE,
                          num_additional_image_tokens=1, image_token="<image>")
    return model, proc


def caption_messages(img, prompt: str = CAPTION_PROMPT) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": prompt}]}]


def _rows(memeworld: Path, splits: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = read_jsonl(memeworld / "memeworld.jsonl")
    return [r for r in rows if r["split"] in splits]


def _pixels(proc, memeworld: Path, rels: list[str]):
    import torch
    chunks = []
    for k in range(0, len(rels), 512):
        ims = [Image.open(memeworld / r).convert("RGB") for r in rels[k:k + 512]]
        chunks.append(proc.image_processor(images=ims, return_tensors="pt")["pixel_values"])
    return torch.cat(chunks)


def prompt_ids(proc) -> list[int]:
    """Token ids of the caption prompt (image tokens expanded), exactly as chat inference builds them."""
    enc = proc.apply_chat_template(caption_messages(Image.new("RGB", (8, 8))), add_generation_prompt=True,
                                   tokenize=True, return_dict=True, return_tensors="pt")
    return enc["input_ids"][0].tolist()



def optimizer_step(model, opt, sched, loss) -> float:
    """One step of every embedded model's training (memeworld-clip, -vlm, -nli): backward, gradients
    clipped to norm 1, the optimiser and its schedule stepped; the loss as a number."""
    import torch
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss.item()


def fit(model, opt, sched, epochs: int, total_steps: int, losses: Callable[[int], Iterable[Any]], desc: str,
        progress: bool = True) -> tuple[list[dict[str, float]], float]:
    """The loop every embedded model trains in: each loss that `losses(epoch)` yields (one batch's,
    computed when asked for) takes one `optimizer_step`. Returns the per-epoch curve (mean loss, seconds
    so far) and the seconds it took."""
    curve, t0 = [], time.time()
    bar = tqdm(total=total_steps, desc=desc, disable=not progress)
    for epoch in range(epochs):
        seen = []
        for loss in losses(epoch):
            seen.append(optimizer_step(model, opt, sched, loss))
            bar.update(1)
        curve.append({"epoch": epoch + 1, "loss": float(np.mean(seen)), "seconds": time.time() - t0})
    bar.close()
    return curve, time.time() - t0

def generate_captions(model, proc, pixel_values, max_new_tokens: int = 40, batch: int = 64) -> list[str]:
    """Greedy captions for a batch of images (the prompt is the same length for every image)."""
    import torch
    ids = torch.tensor(prompt_ids(proc))
    tok = proc.tokenizer
    out: list[str] = []
    model.eval()
    with torch.no_grad():
        for k in range(0, len(pixel_values), batch):
            px = pixel_values[k:k + batch]
            inp = ids.unsqueeze(0).repeat(len(px), 1)
            gen = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), pixel_values=px,
                                 max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            out += [t.strip() for t in tok.batch_decode(gen[:, inp.shape[1]:], skip_special_tokens=True)]
    return out


def caption_training(model, prompts: Sequence[list[int]], targets: Sequence[list[int]], X, pad_id: int, cfg: Any,
                     steps_per_epoch: int):
    """The captioning fine-tune memeworld-vlm and the interplay captioner share: each row is its prompt's ids then
    its target's, padded to the longest row, the loss on the target's tokens only; AdamW with the vision tower at
    `cfg.vision_lr_scale` of the rest's rate (`cfg.lr`, `cfg.weight_decay`); a one-cycle schedule over
    `cfg.epochs * steps_per_epoch` steps. Returns (optimizer, scheduler, losses) for `fit`: `losses(epoch)` yields
    each step's loss over `cfg.batch_size` rows (with `X[i]`, row i's pixels) in a fresh random order."""
    import torch
    L = max(len(p) + len(t) for p, t in zip(prompts, targets))
    ids = torch.full((len(targets), L), pad_id, dtype=torch.long)
    labels = torch.full((len(targets), L), -100, dtype=torch.long)
    att = torch.zeros((len(targets), L), dtype=torch.long)
    for i, (p, t) in enumerate(zip(prompts, targets)):
        n = len(p) + len(t)
        ids[i, :n] = torch.tensor(p + t)
        labels[i, len(p):n] = torch.tensor(t)
        att[i, :n] = 1
    vision = [w for name, w in model.named_parameters() if "vision_tower" in name]
    rest = [w for name, w in model.named_parameters() if "vision_tower" not in name]
    opt = torch.optim.AdamW([{"params": rest, "lr": cfg.lr},
                             {"params": vision, "lr": cfg.lr * cfg.vision_lr_scale}], weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[cfg.lr, cfg.lr * cfg.vision_lr_scale],
                                                total_steps=cfg.epochs * steps_per_epoch, pct_start=0.1)

    def losses(epoch: int):
        model.train()
        perm = torch.randperm(len(targets))
        for s in range(steps_per_epoch):
            idx = perm[s * cfg.batch_size:(s + 1) * cfg.batch_size]
            n = int(att[idx].sum(1).max())
            yield model(input_ids=ids[idx, :n], attention_mask=att[idx, :n], pixel_values=X[idx],
                        labels=labels[idx, :n]).loss
    return opt, sched, losses


def train_memeworld_vlm(memeworld: Path | str, clip_dir: Path | str, out_dir: Path | str,
                        cfg: VlmConfig = VlmConfig(), progress: bool = True) -> dict[str, Any]:
    """Train memeworld-vlm to caption MemeWorld; save it; return metrics and the training curve."""
    import torch
    memeworld, clip_dir, out_dir = Path(memeworld), Path(clip_dir), Path(out_dir)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tok = train_tokenizer(memeworld_texts(memeworld), cfg.vocab_size)
    model, proc = build_vlm(tok, clip_dir, cfg)
    train = _rows(memeworld, ("train",))
    X = _pixels(proc, memeworld, [r["img"] for r in train])
    prompt = prompt_ids(proc)
    targets = [tok(" " + r["gold_caption"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in train]
    steps_per_epoch = len(train) // cfg.batch_size
    opt, sched, losses = caption_training(model, [prompt] * len(train), targets, X, tok.pad_token_id, cfg,
                                          steps_per_epoch)
    curve, train_s = fit(model, opt, sched, cfg.epochs, cfg.epochs * steps_per_epoch, losses, "train memeworld-vlm",
                         progress)
    metrics = evaluate_vlm(model, proc, memeworld, cfg, train)
    metrics["vlm_train_s"] = train_s
    save_model(model, proc, out_dir, {"config": asdict(cfg), "curve": curve, "metrics": metrics})
    return {"metrics": metrics, "curve": curve}


def evaluate_vlm(model, proc, memeworld: Path, cfg: VlmConfig, train_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """ROUGE-L of greedy captions on held-out test memes, beside the most-frequent-caption baseline."""
    test = _rows(memeworld, ("test_seen", "test_unseen"))
    rng = np.random.default_rng(cfg.seed)
    test = [test[i] for i in sorted(rng.choice(len(test), size=min(cfg.eval_n, len(test)), replace=False))]
    X = _pixels(proc, memeworld, [r["img"] for r in test])
    golds = [r["gold_caption"] for r in test]
    preds = generate_captions(model, proc, X, cfg.max_new_tokens)
    common = Counter(r["gold_caption"] for r in train_rows).most_common(1)[0][0]
    return {"vlm_rouge_l": float(np.mean(rouge_l(preds, golds))),
            "vlm_rouge_l_baseline": float(np.mean(rouge_l([common] * len(golds), golds))),
            "vlm_exact_match": float(np.mean([p == g for p, g in zip(preds, golds)])), "vlm_eval_n": len(test),
            "vlm_examples": [{"id": r["id"], "gold": g, "pred": p} for r, g, p in list(zip(test, golds, preds))[:8]]}

