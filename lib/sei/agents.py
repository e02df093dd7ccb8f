"""See, Explain, Intervene (§5.1): four task agents fine-tuned from one image-text-to-text model.

| agent        | trained on                                   | input                           | writes            |
|--------------|----------------------------------------------|---------------------------------|-------------------|
| captioner    | MemeCap train+val (`meme_captions`)          | meme image (+ its text)         | what the meme means |
| explainer    | HatReDAug (HatReD + non-hateful reasonings)  | image (+ text) and gold label   | explanation       |
| commonsense  | MemeSense train (commonsense description)    | image (+ text)                  | commonsense text  |
| intervention | MemeSense train                              | image (+ text) and commonsense  | intervention      |

The paper fine-tunes `paligemma-3b-pt-448` (full fine-tuning, Adam, lr 2e-5, weight decay 1e-6,
2 epochs, bf16, one GPU); the embedded profile fine-tunes `memeworld-vlm` the same way on CPU.
One trainer serves both: examples are rendered with the model's chat template (the prompt as a
user turn with the image, the target as the assistant turn; loss on the answer only), or for a
model without one (PaliGemma-pt) as a prefix + suffix through its processor. Training runs under
`accelerate` (one process here; `accelerate launch` spreads it over several GPUs).

On a GPU, `train_agent` first estimates one step's memory from the model's configuration
(`lib.models.train_memory`) and refuses a recipe that cannot fit the free memory with a 10% margin, naming
a batch size, accumulation and checkpointing that fit. The paper profile trains with
`gradient_checkpointing` and `answer_logits_only` (the same loss from the answer span's logits):
without them, batch 8 x 1,536 tokens of PaliGemma-3B does not fit 80 GB. An example whose answer
`max_len` cuts away entirely is an error (or, with `drop_cut_answers`, left out and counted), and a
non-finite loss stops training naming the step and its memes; each run starts from a fresh
accelerate state, so one kernel can train in two precisions.

A trained agent is a model folder like any other: it is driven through `lib.models.chat` (response
cache included) for Table 3 and for silver data. Training is cached on its inputs: the same
base weights, examples, prompts and recipe reuse the saved agent.

The prompts are template files (`params/prompts/sei/agents/<agent>.txt`; placeholders `{ocr}`,
`{label}`, `{commonsense}`). The paper gives none (its gap 9); the compendium's own include the
meme's text because at 64 pixels `memeworld-vlm` cannot read it from the image (PaliGemma can,
and a profile may point at templates without `{ocr}`).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm
from transformers import AutoModelForImageTextToText, AutoProcessor

from lib import ROOT
from lib.compendium.artifacts import MissingInputError, code_of
from lib.models.chat import Chat, GenParams, image, text, user
from lib.models.chat.hf import HFChatBackend
from lib.compendium.artifacts import save_model
from lib.sei.retrieval import rank
from lib.compendium.presets import default_device, folder_identity, get_preset, new_accelerator, torch_dtype
from lib.models.train_memory import RecipeMemoryError, check_fits, free_bytes, shape_of
from lib.sei.training_step import (ANSWER_KEYS, LAZY_PIXEL_BYTES, LazyExamples, PaddedExamples,  # noqa: F401
                                   TrainingDataError, UpdateProbe, _answer_index, _every_rank_or_none, _global_count,
                                   _softcap, answer_loss, empty_device_cache, full_batches, release_training)
from lib.compendium import sharding

AGENTS = ("captioner", "explainer", "commonsense", "intervention")
#: the modules whose definitions train an agent (its recipe, encoding and loop; the embedded base VLM's model
#: class): a change to them retrains the agents, a change elsewhere reads them back
TRAINING_CODE = ("lib.sei.agents", "lib.sei.training_step", "lib.models.memeworld_vlm")
AGENT_SOURCES = {"captioner": "memecap", "explainer": "hatred", "commonsense": "memesense", "intervention": "memesense"}
LABEL_WORDS = {0: "non-hateful", 1: "hateful"}


class AgentDataError(TrainingDataError):
    """An agent's training data is missing or malformed (names the dataset, record and field)."""


def norm_id(x: Any) -> str:
    """Meme ids across formats: '01235.png', '1235' and 1235 are the same meme."""
    s = Path(str(x)).stem
    return s.lstrip("0") or "0"


@dataclass
class AgentExample:
    agent: str
    id: str                          # normalised meme id
    img_path: Path
    inputs: dict[str, str]           # template fields: ocr, label, commonsense
    target: str
    references: list[str]            # every gold text (max over references when scoring)
    split: str                       # train | test


@dataclass
class AgentRecipe:
    """Fine-tuning recipe (paper: Adam, lr 2e-5, wd 1e-6, 2 epochs, bf16)."""
    base: str = "memeworld-vlm"      # chat preset or local model folder to fine-tune
    epochs: int = 2
    lr: float = 2e-5
    weight_decay: float = 1e-6
    batch_size: int = 8
    grad_accum: int = 1
    warmup_share: float = 0.0        # the paper names no schedule: constant lr by default
    max_train: int = 0               # examples per agent (0: all), a seeded random subset
    max_len: int = 256               # tokens per example (image tokens + prompt + answer); longer examples
                                     #   lose the end of their answer, never an image token (an error says
                                     #   how long; PaliGemma-448 puts 1024 image tokens in every prompt)
    mixed_precision: str = "no"      # accelerate: no | bf16 | fp16
    dtype: str = "float32"           # weights dtype for loading (paper: bfloat16)
    gradient_checkpointing: bool = False   # recompute each layer in the backward pass (non-reentrant): the
                                     #   paper's batch 8 x 1536 tokens fits an 80 GB GPU only with it on; the
                                     #   same gradients, about 1.3x the compute
    drop_cut_answers: bool = False   # an example whose whole answer max_len cuts away is an error (it would
                                     #   train on no token); true leaves such examples out and counts them
    attn_implementation: str = "sdpa"  # fused attention (torch's SDPA: flash / memory-efficient kernels on a
                                     #   GPU) instead of eager's s x s scores per head; "eager" or
                                     #   "flash_attention_2" where a model needs them; "auto": the library's default
    answer_logits_only: bool = False  # the same loss from the logits of the answer tokens alone, in chunks of
                                     #   `loss_chunk` positions, each chunk's float32 logits recomputed in the
                                     #   backward pass instead of kept: PaliGemma's 257k-vocabulary logits over
                                     #   all 1,536 positions (and their float32 copies) are most of a batch's
                                     #   memory; off: the model's own loss
    loss_chunk: int = 1024           # answer positions per chunk of the answer-only loss
    sharding: str = "ddp"            # under `accelerate launch` on several GPUs: "ddp", every GPU a whole copy (the
                                     #   paper's 3B model fits one); "fsdp", the weights, gradients and Adam state
                                     #   split over the GPUs (torch FSDP2 through accelerate), for a model one GPU's
                                     #   memory cannot hold; GPUs only
    float32_master_weights: bool = False  # not the paper's recipe: it updates bfloat16 weights in place, and an
                                     #   Adam step under half a bfloat16 unit of a weight (lr 2e-5 on any weight
                                     #   above about 8e-3) is rounded away; true keeps float32 weights (and Adam
                                     #   state) that train under `mixed_precision`, saved in `dtype`. The
                                     #   training record's `update_share` says what share of the weights a step
                                     #   changed either way. Memory: 16 bytes per parameter instead of 8
    seed: int = 0
    threads: int = 2
    prompt_dir: str = "params/prompts/sei/agents"


def prompt_templates(prompt_dir: str | Path) -> dict[str, str]:
    d = Path(prompt_dir)
    d = d if d.is_absolute() else ROOT / d
    out = {}
    for a in AGENTS:
        p = d / f"{a}.txt"
        if not p.exists():
            raise FileNotFoundError(f"agent prompt {p} does not exist (one template per agent: {', '.join(AGENTS)})")
        out[a] = p.read_text(encoding="utf-8").strip("\n")
    return out


def render_prompt(template: str, inputs: dict[str, str]) -> str:
    try:
        return template.format(**inputs)
    except KeyError as e:
        raise KeyError(f"agent prompt template uses {{{e.args[0]}}}, which this agent does not provide "
                       f"(provided: {sorted(inputs)})") from None


# ----------------------------------------------------------------------------- data
def build_agent_data(memecap: Sequence[Any], hatred: Sequence[Any], memesense: Sequence[Any],
                     memes: Sequence[Any], memesense_test_ids: set[str] | None = None) -> dict[str, list[AgentExample]]:
    """Examples per agent. `memes` (FHM-style records) give each meme's text (the OCR field) and
    gold label; a HatReD record's label is its FHM label (HatReDAug holds both classes).
    MemeSense has no public split in MemeWorld's copy: a record is held out when its meme is in
    `memesense_test_ids` (default: the memes of the FHM test splits)."""
    text = {norm_id(m.id): m.text or "" for m in memes}
    label = {norm_id(m.id): m.label for m in memes if m.label is not None}
    test_memes = {norm_id(m.id) for m in memes if str(m.split).startswith("test")}
    out: dict[str, list[AgentExample]] = {a: [] for a in AGENTS}
    for r in memecap:
        i = norm_id(r.id)
        caps = [c for c in r.meme_captions if c]
        if not caps:
            raise AgentDataError(f"memecap record {r.id}: field 'meme_captions' is empty")
        split = "test" if r.split == "test" else "train"
        out["captioner"].append(AgentExample("captioner", i, r.img_path, {"ocr": text.get(i, r.title or "")},
                                             caps[0], caps, split))
    for r in hatred:
        i = norm_id(r.id)
        refs = [x for x in r.reasonings if x]
        if not refs:
            raise AgentDataError(f"hatred record {r.id}: field 'reasonings' is empty")
        lab = label.get(i, 1 if r.targets else 0)
        out["explainer"].append(AgentExample("explainer", i, r.img_path, {"ocr": text.get(i, ""),
                                                                          "label": LABEL_WORDS[int(lab)]},
                                             refs[0], refs, "test" if r.split == "test" else "train"))
    held = memesense_test_ids if memesense_test_ids is not None else test_memes
    for r in memesense:
        i = norm_id(r.id)
        for fld in ("commonsense", "intervention"):
            if not getattr(r, fld):
                raise AgentDataError(f"memesense record {r.id}: field '{fld}' is empty")
        split = r.split if r.split in ("train", "test") else ("test" if i in held else "train")
        ocr = text.get(i, "")
        out["commonsense"].append(AgentExample("commonsense", i, r.img_path, {"ocr": ocr}, r.commonsense,
                                               [r.commonsense], split))
        out["intervention"].append(AgentExample("intervention", i, r.img_path,
                                                {"ocr": ocr, "commonsense": r.commonsense}, r.intervention,
                                                [r.intervention], split))
    return out


def examples_digest(examples: Sequence[AgentExample], template: str) -> str:
    h = hashlib.sha256(template.encode())
    for e in examples:
        h.update(json.dumps([e.id, str(Path(e.img_path).name), e.inputs, e.target], sort_keys=True).encode())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- encoding
def _load_base(base: str, dtype: str, attn_implementation: str = "auto"):
    p = Path(base)
    if not (p.is_dir() and (p / "config.json").exists()):
        pr = get_preset("chat", base)
        p = Path(pr.resolved_model)
        if "{artifacts}" in pr.model and not p.exists():
            raise MissingInputError(f"agent base model '{base}': {p} does not exist; "
                                    f"train it with `make reproduce NB=models`")
        src, kw = str(p) if p.exists() else pr.model, ({"revision": pr.revision} if pr.revision and not p.exists()
                                                       else {})
    else:
        src, kw = str(p), {}
    proc = AutoProcessor.from_pretrained(src, **kw)
    attn = {} if attn_implementation in (None, "auto") else {"attn_implementation": attn_implementation}
    model = AutoModelForImageTextToText.from_pretrained(src, dtype=torch_dtype(dtype), **kw, **attn)
    return model, proc, src


def _messages(img, prompt: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": prompt}]}]


def image_token_id(proc) -> int | None:
    """The id of the placeholder a VLM processor repeats once per image feature (None: no such token)."""
    tid = getattr(proc, "image_token_id", None)
    if tid is not None:
        return int(tid)
    tok, name = getattr(proc, "tokenizer", proc), getattr(proc, "image_token", None)
    if name is None or not hasattr(tok, "convert_tokens_to_ids"):
        return None
    tid = tok.convert_tokens_to_ids(name)
    return None if tid is None or tid == getattr(tok, "unk_token_id", None) else int(tid)


def encode_example(proc, img, prompt: str, target: str, max_len: int) -> dict[str, Any]:
    """input_ids, labels (-100 outside the answer) and pixel inputs for one example.

    Chat-template models: the full conversation (user turn + assistant answer) is rendered and its
    prefix must equal the generation prompt inference uses, so training and inference see the same
    tokens. Models without a chat template (PaliGemma-pt): the processor's prefix/suffix encoding."""
    tok = getattr(proc, "tokenizer", proc)
    if getattr(proc, "chat_template", None) or getattr(tok, "chat_template", None):
        msgs = _messages(img, prompt)
        enc_p = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True,
                                         return_tensors="pt")
        full = msgs + [{"role": "assistant", "content": [{"type": "text", "text": target}]}]
        enc_f = proc.apply_chat_template(full, tokenize=True, return_dict=True, return_tensors="pt")
        p_ids, f_ids = enc_p["input_ids"][0].tolist(), enc_f["input_ids"][0].tolist()
        if f_ids[:len(p_ids)] != p_ids:
            raise ValueError("the chat template renders the answer turn so that the prompt's tokens change; "
                             "agent training needs the generation prompt to be a prefix of the full conversation")
        if tok.eos_token_id is not None and f_ids[-1] != tok.eos_token_id:
            f_ids = f_ids + [tok.eos_token_id]
        labels = [-100] * len(p_ids) + f_ids[len(p_ids):]
        ids = f_ids
        extra = {k: v[0] for k, v in enc_f.items() if k not in ("input_ids", "attention_mask", "token_type_ids")}
    else:
        enc = proc(text=[prompt], images=[img], suffix=[target], return_tensors="pt")
        ids = enc["input_ids"][0].tolist()
        labels = enc["labels"][0].tolist()
        extra = {k: v[0] for k, v in enc.items() if k not in ("input_ids", "attention_mask", "labels",
                                                              "token_type_ids")}
        if "token_type_ids" in enc:                  # PaliGemma: 0 prefix (bidirectional), 1 suffix (causal)
            extra["token_type_ids"] = enc["token_type_ids"][0].tolist()
    full_len, answer_tokens = len(ids), sum(t != -100 for t in labels)
    if len(ids) > max_len:
        img_id = image_token_id(proc)
        last_img = max((k for k, t in enumerate(ids) if t == img_id), default=-1) if img_id is not None else -1
        if last_img >= max_len - 1:
            raise ValueError(f"AgentRecipe.max_len={max_len} would cut this example inside its "
                             f"{ids.count(img_id)} image tokens (the processor puts them in every prompt; "
                             f"the model then fails with 'image features and image tokens do not match'): "
                             f"set agent_recipe's max_len above {last_img + 1} plus the text, e.g. "
                             f"{last_img + 1 + 512}")
        ids, labels = ids[:max_len], labels[:max_len]
        if "token_type_ids" in extra:
            extra["token_type_ids"] = extra["token_type_ids"][:max_len]
    # what max_len left of the answer ("_" keys are bookkeeping: the collator leaves them out of the batch)
    return {"input_ids": ids, "labels": labels, **extra, "_full_len": full_len, "_answer_tokens": answer_tokens,
            "_answer_kept": sum(t != -100 for t in labels)}


def _collate(batch: list[dict[str, Any]], pad_id: int):
    n = max(len(b["input_ids"]) for b in batch)
    ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    lab = torch.full((len(batch), n), -100, dtype=torch.long)
    att = torch.zeros((len(batch), n), dtype=torch.long)
    for i, b in enumerate(batch):
        k = len(b["input_ids"])
        ids[i, :k] = torch.tensor(b["input_ids"])
        lab[i, :k] = torch.tensor(b["labels"])
        att[i, :k] = 1
    out = {"input_ids": ids, "attention_mask": att, "labels": lab}
    if "token_type_ids" in batch[0]:                 # per-token, padded like the ids (0 at padding)
        tt = torch.zeros((len(batch), n), dtype=torch.long)
        for i, b in enumerate(batch):
            tt[i, :len(b["token_type_ids"])] = torch.tensor(b["token_type_ids"])
        out["token_type_ids"] = tt
    for key in batch[0]:
        if key not in ("input_ids", "labels", "token_type_ids") and not key.startswith("_"):
            out[key] = torch.stack([b[key] for b in batch])
    if "_id" in batch[0]:
        out["_ids"] = [b["_id"] for b in batch]      # which examples: named when a step's loss is not finite
    out.update(_answer_index(lab))
    return out


# ----------------------------------------------------------------------------- training
def agent_key(base_digest: Any, recipe: AgentRecipe, train: Sequence[AgentExample], template: str) -> str:
    """What a trained agent is read back under: its base's weights, the parts of the recipe that change the weights
    it trains, its examples and prompt, and the code that trains it (TRAINING_CODE)."""
    rec_json = {k: v for k, v in asdict(recipe).items()             # what changes the weights a recipe trains
                if k not in ("threads", "prompt_dir", "gradient_checkpointing", "answer_logits_only", "attn_implementation",
                             "loss_chunk", "sharding")
                and not (k in ("drop_cut_answers", "float32_master_weights") and not v)}
    return hashlib.sha256(json.dumps({"base": base_digest, "recipe": rec_json, "code": code_of(*TRAINING_CODE),
                                      "data": examples_digest(train, template)}, sort_keys=True).encode()).hexdigest()[:16]


def train_agent(examples: Sequence[AgentExample], out_dir: str | Path, recipe: AgentRecipe, template: str,
                progress: bool = True, force: bool = False) -> dict[str, Any]:
    """Fine-tune recipe.base on the train examples; save to out_dir; return the training record.
    Reuses a saved agent whose inputs (base weights, examples, prompt, recipe) are the same."""
    out_dir = Path(out_dir)
    train = [e for e in examples if e.split == "train"]
    if not train:
        raise AgentDataError(f"agent {examples[0].agent if examples else '?'}: no training examples")
    agent = train[0].agent
    if recipe.max_train and len(train) > recipe.max_train:
        rng = random.Random(recipe.seed)
        train = sorted(rng.sample(train, recipe.max_train), key=lambda e: e.id)
    model, proc, src = _load_base(recipe.base, "float32" if recipe.float32_master_weights else recipe.dtype,
                                  recipe.attn_implementation)
    base_digest = folder_identity(src)
    key = agent_key(base_digest, recipe, train, template)
    rec_path = out_dir / "training.json"
    if not force and rec_path.exists() and (out_dir / "config.json").exists():
        old = json.loads(rec_path.read_text())
        if old.get("key") == key:
            return {**old, "cached": True}
    torch.manual_seed(recipe.seed)
    torch.set_num_threads(recipe.threads)
    tok = getattr(proc, "tokenizer", proc)
    device, estimate = default_device(), None
    from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs
    # split_batches: under `accelerate launch` the recipe's batch is split over the processes, so a launch on
    # several GPUs trains what one GPU trains (the same effective batch, the same loss: `_global_count`); DDP is
    # told that some weights get no gradient (a checkpoint's unused heads) and that the answer-only loss reaches
    # the output layer outside the model's forward
    if recipe.sharding not in ("ddp", "fsdp"):
        raise ValueError(f"agent_recipe's sharding is {recipe.sharding!r}: expected 'ddp' or 'fsdp'")
    if recipe.sharding == "fsdp" and device != "cuda":
        raise ValueError("agent_recipe's sharding 'fsdp' splits a model over GPUs; this process has none (use 'ddp')")
    fsdp = {}
    if recipe.sharding == "fsdp":
        from accelerate import FullyShardedDataParallelPlugin
        fsdp = {"fsdp_plugin": FullyShardedDataParallelPlugin(
            fsdp_version=2, reshard_after_forward=True, auto_wrap_policy="transformer_based_wrap",
            state_dict_type="FULL_STATE_DICT", cpu_ram_efficient_loading=False,
            activation_checkpointing=False)}     # checkpointing stays the model's own (gradient_checkpointing)
    acc = new_accelerator(mixed_precision=recipe.mixed_precision, gradient_accumulation_steps=recipe.grad_accum,
                          cpu=device == "cpu", dataloader_config=DataLoaderConfiguration(
                              non_blocking=device == "cuda", split_batches=True),
                          kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)], **fsdp)
    world = acc.num_processes
    if recipe.batch_size % world:
        raise ValueError(f"agent {agent}: batch_size {recipe.batch_size} is split over {world} processes: make it a "
                         f"multiple of {world}")
    encoded, lazy = [], None
    target = (lambda t: " " + t) if _leading_space(proc) else (lambda t: t)
    for e in tqdm(train, desc=f"encode {agent}", disable=not progress, leave=False):
        src = (str(e.img_path), render_prompt(template, e.inputs), target(e.target))
        with Image.open(src[0]) as im:
            enc = encode_example(proc, im.convert("RGB"), src[1], src[2], recipe.max_len)
        if lazy is None:    # held in memory unless a launch or the pixels' size says otherwise (LazyExamples)
            pixels = sum(v.numel() * v.element_size() for v in enc.values() if isinstance(v, torch.Tensor))
            lazy = world > 1 or pixels * len(train) > LAZY_PIXEL_BYTES
        encoded.append({**({k: v for k, v in enc.items() if not isinstance(v, torch.Tensor)} if lazy else enc),
                        "_id": e.id, "_src": src})
    encoded, cut = answers_in_reach(encoded, agent, recipe)
    if recipe.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):          # transformers >= 5.x's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    checkpointing = bool(getattr(model, "is_activation_checkpointing", None)      # transformers >= 5.x's name
                         if hasattr(model, "is_activation_checkpointing")
                         else getattr(model, "is_gradient_checkpointing", False))
    refusal = None
    if _on_gpu(acc):                  # each rank on its own device, before anything is on it: refuse what cannot fit
        longest = max(len(x["input_ids"]) for x in encoded)
        earliest = min(next(k for k, t in enumerate(x["labels"]) if t != -100) for x in encoded)
        try:
            estimate = check_recipe_memory(
                model, replace(recipe, batch_size=recipe.batch_size // world), longest,
                shards=world if recipe.sharding == "fsdp" else 1, ddp=world > 1 and recipe.sharding == "ddp",
                free_bytes=gpu_free_bytes(acc.device),
                where="this GPU" if world == 1 else (
                    f"{acc.device} (rank {acc.process_index} of {world}; the batch sizes here are each GPU's, the "
                    f"recipe's batch_size is {world} times one)"),
                logit_tokens=longest - earliest + 1 if recipe.answer_logits_only else None)   # from the earliest answer
        except RecipeMemoryError as e:
            refusal = e
    _every_rank_or_none(acc, refusal)
    g = torch.Generator().manual_seed(recipe.seed)
    data = LazyExamples(encoded, lambda im, pr, tg: encode_example(proc, im, pr, tg, recipe.max_len)) if lazy else encoded
    collate = lambda b: _collate(b, tok.pad_token_id or 0)           # noqa: E731
    if world == 1:
        loader = torch.utils.data.DataLoader(data, batch_size=recipe.batch_size, shuffle=True, generator=g,
                                             collate_fn=collate, pin_memory=acc.device.type == "cuda")
    else:       # one process's batches, the last filled up with answerless copies, so that no process trains on
                # a repeated example (accelerate would refill a short last batch from the first)
        loader = torch.utils.data.DataLoader(
            PaddedExamples(data), batch_sampler=full_batches(len(data), recipe.batch_size, g), collate_fn=collate,
            pin_memory=acc.device.type == "cuda")
    opt = torch.optim.Adam(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps = recipe.epochs * max(1, len(loader) // recipe.grad_accum)
    warm = int(recipe.warmup_share * steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    head = model.get_output_embeddings()
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    probe = UpdateProbe(acc.unwrap_model(model), seed=recipe.seed)
    try:
        return _train_loop(acc, model, opt, loader, sched, head, probe, recipe, agent, world, encoded, cut, key,
                           base_digest, checkpointing, estimate, proc, out_dir, progress)
    finally:        # done or failed, nothing of the model stays on the device
        release_training(acc, model)
        del model, opt, loader, sched, head, probe
        empty_device_cache()


def _train_loop(acc, model, opt, loader, sched, head, probe, recipe: AgentRecipe, agent: str, world: int,
                encoded: list[dict[str, Any]], cut: dict[str, int], key: str, base_digest: Any, checkpointing: bool,
                estimate: dict[str, float] | None, proc, out_dir: Path, progress: bool) -> dict[str, Any]:
    """train_agent's epochs, record and save (its caller releases the model, whatever happens here)."""
    syncs = recipe.epochs * math.ceil(len(loader) / recipe.grad_accum)     # optimizer steps that update the weights
    curve, t0, done = [], time.time(), 0
    bar = tqdm(total=recipe.epochs * len(loader), desc=f"fine-tune {agent}", disable=not progress)
    for epoch in range(recipe.epochs):
        model.train()
        losses = []
        pending: list[tuple[int, list[str], Any]] = []   # losses stay on the device: one host sync per 16 steps
        for step, batch in enumerate(loader, 1):
            ids = batch.pop("_ids")
            answer = {k: batch.pop(k) for k in ANSWER_KEYS}
            with acc.accumulate(model):
                if world > 1:   # each rank's sum over the whole batch's answer tokens: DDP's mean is one process's loss
                    loss = answer_loss(model, batch, answer, head, acc.autocast, recipe.loss_chunk,
                                       denominator=_global_count(acc, answer) / world)
                elif recipe.answer_logits_only:
                    loss = answer_loss(model, batch, answer, head, acc.autocast, recipe.loss_chunk)
                else:
                    loss = model(**batch).loss
                acc.backward(loss)
                measured = acc.sync_gradients and (done == 0 or done == syncs - 1)   # the first and last update
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 1.0)
                    done += 1
                if measured:
                    probe.before()
                opt.step()
                if measured:
                    probe.after()
                sched.step()
                opt.zero_grad(set_to_none=True)
            pending.append((step, ids, loss.detach()))
            bar.update(1)
            if len(pending) == LOSS_SYNC_EVERY or step == len(loader):
                stacked = torch.stack([x[2] for x in pending]).float()
                values = stacked.cpu().tolist()
                bad = next(((at, memes, value) for (at, memes, _), value in zip(pending, values)
                            if not math.isfinite(value)), None)
                error = None if bad is None else (
                    f"agent {agent}: the training loss is {bad[2]} at epoch {epoch + 1}, step {bad[0]} of "
                    f"{len(loader)} (memes {', '.join(bad[1])}{f', rank {acc.process_index}' if world > 1 else ''}); "
                    f"nothing was saved (recipe: lr {recipe.lr}, mixed_precision {recipe.mixed_precision}, dtype "
                    f"{recipe.dtype})")
                # every rank learns of a non-finite loss on any rank at the same step, and all stop (one stopping
                # alone would leave the others waiting in their next all-reduce); nothing is saved
                _every_rank_or_none(acc, FloatingPointError(error) if error else None)
                # each rank's loss is its share of the batch's; their mean over the ranks is the batch's loss
                losses += acc.reduce(stacked, reduction="mean").cpu().tolist() if world > 1 else values
                pending = []
        curve.append({"epoch": epoch + 1, "loss": float(np.mean(losses)), "seconds": time.time() - t0})
    bar.close()
    record = {"agent": agent, "key": key, "base": recipe.base, "base_digest": base_digest, "recipe": asdict(recipe),
              "n_train": len(encoded), "tokens_per_example": float(np.mean([len(x["input_ids"]) for x in encoded])),
              "n_answer_cut": cut["whole"], "n_answer_shortened": cut["part"],
              "gradient_checkpointing": checkpointing,
              "attn_implementation": getattr(acc.unwrap_model(model).config, "_attn_implementation", None), "curve": curve,
              "memory_estimate_gib": round(estimate["total"] / 2 ** 30, 2) if estimate else None,
              "update_share": probe.shares(), "train_s": time.time() - t0}
    # a sharded model's full weights are gathered from every rank (a collective: all ranks take part)
    full = acc.get_state_dict(model) if recipe.sharding == "fsdp" else None
    if acc.is_main_process:
        trained = acc.unwrap_model(model)
        if recipe.float32_master_weights:                 # trained in float32, served in the recipe's dtype
            trained = trained.to(torch_dtype(recipe.dtype))
            full = {k: v.to(torch_dtype(recipe.dtype)) if v.is_floating_point() else v
                    for k, v in full.items()} if full is not None else None
        save_model(trained, proc, out_dir, record, state_dict=full)
        del trained
    del full
    acc.wait_for_everyone()
    return {**record, "cached": False}


def _on_gpu(acc) -> bool:
    """Whether this process trains on a CUDA device (the memory check runs there)."""
    return acc.device.type == "cuda"


def answers_in_reach(encoded: list[dict[str, Any]], agent: str, recipe: AgentRecipe
                     ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The encoded examples that keep at least one answer token after `max_len`, and how many lost it all
    ("whole") or its end ("part"). An example with no answer token contributes nothing to the loss, and a
    batch made only of such examples has a NaN loss (0 / 0), so one is an error naming the examples and the
    max_len they need, unless the recipe's drop_cut_answers leaves them out (the record counts them)."""
    whole = [x for x in encoded if x["_answer_kept"] == 0]
    part = sum(1 for x in encoded if 0 < x["_answer_kept"] < x["_answer_tokens"])
    if whole and not recipe.drop_cut_answers:
        need = max(x["_full_len"] for x in whole)
        names = ", ".join(str(x["_id"]) for x in whole[:10]) + (", ..." if len(whole) > 10 else "")
        raise AgentDataError(
            f"agent {agent}: max_len {recipe.max_len} cuts away the whole answer of {len(whole)} of {len(encoded)} "
            f"training examples (memes {names}); they would train on no token, and a batch of only such "
            f"examples has a NaN loss. Set agent_recipe's max_len to at least {need} (the longest of them, "
            f"answer included), or drop_cut_answers: true to leave them out (the training record counts them)")
    kept = [x for x in encoded if x["_answer_kept"] > 0]
    if not kept:
        raise AgentDataError(f"agent {agent}: no training example keeps an answer token at max_len {recipe.max_len}")
    return kept, {"whole": len(whole), "part": part}


def check_recipe_memory(model, recipe: AgentRecipe, seq_len: int, free_bytes: float | None = None,
                        logit_tokens: int | None = None, where: str = "this GPU", shards: int = 1,
                        ddp: bool = False) -> dict[str, float]:
    """Refuse (RecipeMemoryError) a recipe whose training step cannot fit the GPU's free memory with a 10%
    margin, naming a batch size / accumulation / checkpointing that fits (lib.models.train_memory's estimate from
    the model's configuration; `free_bytes` defaults to what the current CUDA device has free)."""
    if free_bytes is None:
        free_bytes = gpu_free_bytes()
    return check_fits(shape_of(model), recipe.batch_size, recipe.grad_accum, seq_len, free_bytes,
                      recipe.gradient_checkpointing, where=where, logit_tokens=logit_tokens, shards=shards, ddp=ddp)


def gpu_free_bytes(device: Any = None) -> float:
    """Free memory of a CUDA device (default: the current one), the caching allocator's unused blocks included."""
    return free_bytes(device)


#: steps between host synchronisations of the training loss (each reads the pending losses at once)
LOSS_SYNC_EVERY = 16


def _leading_space(proc) -> bool:
    """memeworld-vlm's template ends the generation prompt with 'ASSISTANT:'; its captions were
    trained as ' <caption>'. Other templates end in a newline or a role token: no space."""
    tpl = getattr(proc, "chat_template", None) or getattr(getattr(proc, "tokenizer", proc), "chat_template", None)
    return bool(tpl) and "ASSISTANT:{% endif %}" in tpl


# ----------------------------------------------------------------------------- inference
def agent_chat(agent_dir: str | Path, cache, batch_size: int = 32, device: str | None = None):
    """A trained agent behind the response cache (its identity includes the weights' digest)."""
    d = Path(agent_dir)
    backend = HFChatBackend(str(d), identity={**folder_identity(d), "model": f"agent:{d.name}"}, device=device)
    return Chat(backend, cache, name=d.name, batch_size=batch_size)


def run_agent(chat, template: str, items: Sequence[tuple[Any, dict[str, str]]], max_new_tokens: int = 100,
              temperature: float = 0.0, desc: str | None = None, progress: bool = True) -> list[Any]:
    """Agent answers for (image path, template inputs) pairs, through the response cache.
    The paper's temperature 0.001 is greedy decoding for a local model (0.0 here)."""
    convs = [[user(image(str(p)), text(render_prompt(template, inp)))] for p, inp in items]   # sharded in a launch
    return sharding.generate(chat, convs, GenParams(temperature=temperature, max_new_tokens=max_new_tokens),
                             desc=desc, progress=progress)


def nearest_train_baseline(test: Sequence[AgentExample], train: Sequence[AgentExample], emb: dict[str, np.ndarray]
                           ) -> list[str]:
    """The retrieval baseline: each test meme gets the target of the training meme whose image
    embedding is nearest (exact cosine; ties to the earlier training example)."""
    nn = rank(emb, [e.id for e in test], [e.id for e in train], 1)[0][:, 0]
    return [train[j].target for j in nn]
