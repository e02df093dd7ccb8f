"""TRACE's interplay captioner (embedded profile): a captioner that sees what the classifier's encoder cannot.

TRACE's captions come from an 8B VLM that reads a meme's picture *with* its text and can say what the two do
together; the classifier's CLIP encoder reads each alone. MemeWorld's scene captioner (`memeworld-vlm`) says
only what is drawn, which the encoder reads too, so its captions cannot carry TRACE's mechanism (notebook 02's
probe measures that). This module builds the component the mechanism needs, as a named option:

- `train_interplay_captioner`: `memeworld-vlm` fine-tuned on the train split's memes to answer, given the
  picture and the meme's text, with the meme's *account*: MemeWorld's generator's `final_reason` (what the
  text does to the picture: "pairing the ... with sludge rats calls them vermin", "the myth stamp marks the
  hateful claim ... as false"). Supervision the encoder never had; only train memes are used.
- `interplay_prompt`: the captioner's question with the meme text written in (what TRACE's VLM reads on the
  meme itself).
- `cue_check` / `check_from_items`: the isolated check of the component on held-out memes: does its caption
  state the meme's own account, name its interaction type, imply its label; each beside the majority line (the
  commonest account, the commonest label) with a Wilson interval, and per interaction type.

The model is saved as a LLaVA folder (the chat preset `memeworld-vlm-interplay` loads it through the HF chat
backend and the response cache, like every captioner).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from lib.compendium.artifacts import code_of, read_json, read_jsonl, save_model
from lib.compendium.presets import get_preset, weights_digest
from lib.compendium.prompts import prompt_line
from lib.models.chat import load_chat
from lib.models.memeworld_vlm import _pixels, caption_messages, caption_training, fit
from lib.trace.captioning import caption_many

INTERPLAY_PROMPT = prompt_line("caption/interplay.txt")     # {text}: the meme's own text


class InterplayError(ValueError):
    """Bad input to the interplay captioner; the message names the file, record and field."""


#: the modules whose definitions fine-tune the captioner (its own recipe and the base VLM's training): a change to
#: them fine-tunes it again, a change elsewhere reads it back
TRAINING_CODE = ("lib.trace.interplay", "lib.models.memeworld_vlm")


@dataclass
class InterplayConfig:
    """The fine-tuning recipe (CPU, a few minutes on the 7,055 train memes)."""
    epochs: int = 3
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    vision_lr_scale: float = 0.3   # the vision tower, already trained on MemeWorld, moves more slowly
    seed: int = 0
    threads: int = 2
    max_train: int = 0             # 0: every train meme; N: the first N (a quick look, the ci profile)


def interplay_prompt(text: str) -> str:
    """The captioner's question for one meme (its text written in)."""
    return INTERPLAY_PROMPT.format(text=" ".join(str(text).split()))


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9 ]+", "", " ".join(str(s).lower().split())).strip()


def train_rows(memeworld: Path, max_train: int = 0) -> list[dict[str, Any]]:
    """The train split's memes with their accounts (memeworld.jsonl); an error names the record and field."""
    path = Path(memeworld) / "memeworld.jsonl"
    rows = []
    for k, r in enumerate(read_jsonl(path)):
        if r.get("split") != "train":
            continue
        for field in ("img", "text", "final_reason"):
            if not r.get(field) and r.get(field) != "":
                raise InterplayError(f"{path}: record {k} (id {r.get('id')!r}) has no '{field}'")
        rows.append(r)
    if not rows:
        raise InterplayError(f"{path}: no train meme to fine-tune the interplay captioner on")
    return rows[:max_train] if max_train else rows


def train_interplay_captioner(memeworld: Path | str, base_dir: Path | str, out_dir: Path | str,
                              cfg: InterplayConfig = InterplayConfig(), progress: bool = True,
                              base_weights: list[str] | None = None, code: str | None = None) -> dict[str, Any]:
    """Fine-tune the LLaVA folder `base_dir` (memeworld-vlm) to answer `interplay_prompt(text)` about a meme's
    picture with the meme's account; save it to `out_dir` (atomically) with its training record."""
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration
    memeworld, base_dir, out_dir = Path(memeworld), Path(base_dir), Path(out_dir)
    if not (base_dir / "config.json").exists():
        raise InterplayError(f"{base_dir}: no model folder (train memeworld-vlm with `make reproduce NB=models`)")
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    model = LlavaForConditionalGeneration.from_pretrained(base_dir)
    proc = AutoProcessor.from_pretrained(base_dir)
    tok = proc.tokenizer
    rows = train_rows(memeworld, cfg.max_train)
    X = _pixels(proc, memeworld, [r["img"] for r in rows])
    dummy = Image.new("RGB", (8, 8))
    prompts = [proc.apply_chat_template(caption_messages(dummy, interplay_prompt(r["text"])), add_generation_prompt=True,
                                        tokenize=True, return_dict=True, return_tensors="pt")["input_ids"][0].tolist()
               for r in rows]
    targets = [tok(" " + r["final_reason"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in rows]
    L = max(len(p) + len(t) for p, t in zip(prompts, targets))
    limit = model.config.text_config.max_position_embeddings
    if L > limit:
        raise InterplayError(f"{memeworld / 'memeworld.jsonl'}: a train meme's prompt and account take {L} tokens; "
                             f"the captioner holds {limit}")
    steps_per_epoch = max(1, len(rows) // cfg.batch_size)
    opt, sched, losses = caption_training(model, prompts, targets, X, tok.pad_token_id, cfg, steps_per_epoch)
    curve, train_s = fit(model, opt, sched, cfg.epochs, cfg.epochs * steps_per_epoch, losses,
                         "fine-tune the interplay captioner", progress)
    model.eval()
    record = {"config": asdict(cfg), "base": base_dir.name, "base_weights": base_weights, "code": code or code_of(*TRAINING_CODE),
              "n_train": len(rows), "curve": curve,
              "train_s": train_s, "prompt": INTERPLAY_PROMPT}
    save_model(model, proc, out_dir, record)
    return record


def ensure_captioner(memeworld: Path | str, base_dir: Path | str, out_dir: Path | str,
                     cfg: InterplayConfig = InterplayConfig(), progress: bool = True) -> dict[str, Any]:
    """The captioner at `out_dir`: read back when it was fine-tuned from the same base weights with the same
    recipe (its training.json), else fine-tuned now. Returns its training record (`reused` says which)."""
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    base_weights = [weights_digest(w) for w in sorted(base_dir.glob("*.safetensors"))]
    code = code_of(*TRAINING_CODE)
    rec_file = out_dir / "training.json"
    if rec_file.exists():
        rec = read_json(rec_file)
        if rec.get("config") == asdict(cfg) and rec.get("base_weights") == base_weights and rec.get("code") == code:
            return {**rec, "reused": True}
    rec = train_interplay_captioner(memeworld, base_dir, out_dir, cfg, progress, base_weights=base_weights, code=code)
    return {**rec, "reused": False}


# ----------------------------------------------------------------------------- the isolated check
def account_index(accounts: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Normalised account text -> its interaction type, over every meme the generator wrote (an account names
    one type: the group it mentions varies, the type does not)."""
    out: dict[str, str] = {}
    for rid, g in accounts.items():
        reason, t = g.get("final_reason"), g.get("type")
        if reason and t:
            out[_norm(reason)] = str(t)
    return out


def cue_check(captions: dict[str, str], accounts: dict[str, dict[str, Any]], split: str = "dev"):
    """One row per meme of `split` (MemeWorld's generator records `accounts`: id -> record): its type, its
    account, the caption, the type the caption states (the type of the account it equals, "" if none) and
    whether the caption states the meme's own account, its type, its label (a type's last digit)."""
    import pandas as pd
    index = account_index(accounts)
    rows = []
    for rid, g in accounts.items():
        if g.get("split") != split:
            continue
        cap = captions.get(str(rid), "")
        said = index.get(_norm(cap), "")
        t = str(g["type"])
        rows.append({"id": str(rid), "type": t, "account": g["final_reason"], "caption": cap, "caption_type": said,
                     "account_ok": _norm(cap) == _norm(g["final_reason"]), "type_ok": said == t,
                     "label_ok": bool(said) and said[-1] == t[-1]})
    if not rows:
        raise InterplayError(f"cue_check: no meme of split {split!r} among the generator's records")
    return pd.DataFrame(rows)


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of k successes in n (95% by default)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return float(mid - half), float(mid + half)


def check_from_items(items) -> dict[str, Any]:
    """notebook 01's `interplay_*` metrics from `cue_check`'s rows (what results/ keeps: interplay_check.csv):
    the share of memes whose caption states their account, type and label, each with its Wilson interval, the
    majority lines (the commonest account's share; the commonest label's), and the account share per type."""
    items = items.copy()
    items["type"] = items["type"].astype(str).str.zfill(3)
    n = len(items)
    m: dict[str, Any] = {"interplay_check_n": n}
    for what in ("account", "type", "label"):
        k = int(items[f"{what}_ok"].astype(bool).sum())
        lo, hi = wilson(k, n)
        m.update({f"interplay_{what}_acc": k / n if n else float("nan"), f"interplay_{what}_ci_low": lo,
                  f"interplay_{what}_ci_high": hi})
    m["interplay_account_majority"] = Counter(items["account"]).most_common(1)[0][1] / n if n else float("nan")
    m["interplay_type_majority"] = Counter(items["type"]).most_common(1)[0][1] / n if n else float("nan")
    m["interplay_label_majority"] = (Counter(t[-1] for t in items["type"]).most_common(1)[0][1] / n
                                     if n else float("nan"))
    for t, g in items.groupby("type"):
        m[f"interplay_account_acc_{t}"] = float(g["account_ok"].astype(bool).mean())
    return m


def captions_by_id(rows: Sequence[dict[str, Any]], column: str) -> dict[str, str]:
    """meme id -> its caption in `column` of TRACE JSON rows (absent: no caption)."""
    return {str(r["id"]): str(r.get(column) or "") for r in rows}


def caption_with_option(run: dict[str, Any], spec: dict[str, Any], memeworld: Path | str, cache, device=None,
                        max_new_tokens: int = 60, progress: bool = True) -> dict[str, Any]:
    """Notebook 01's interplay option, end to end on one `caption_dataset` run: the captioner (`spec`: column,
    preset, base, check_split, recipe) fine-tuned or read back, every readable meme captioned through the
    response cache with `interplay_prompt`, the column added to the run's TRACE rows (an empty answer leaves it
    out, as caption_dataset does), and the isolated check on `check_split`. Returns the training record, the
    captions, the check's rows and metrics, and the chat model's call counts."""
    memeworld = Path(memeworld)
    cfg = InterplayConfig(**(spec.get("recipe") or {}))
    rec = ensure_captioner(memeworld, get_preset("chat", spec["base"]).resolved_model,
                           get_preset("chat", spec["preset"]).resolved_model, cfg, progress)
    chat = load_chat(spec["preset"], cache=cache, device=device)
    ok, records = run["ok"], run["records"]
    res = caption_many(chat, [run["images"][i] for i in ok], [interplay_prompt(records[i].text) for i in ok],
                       max_new_tokens=max_new_tokens, desc=spec["column"])
    caps = [""] * len(records)
    for i, r in zip(ok, res):
        caps[i] = r.text if r.ok else ""
    for row, cap in zip(run["rows"], caps):
        if cap:
            row[spec["column"]] = cap
    accounts = {str(g["id"]): g for g in map(json.loads, (memeworld / "memeworld.jsonl").read_text().splitlines())}
    items = cue_check({str(r.id): c for r, c in zip(records, caps)}, accounts, spec.get("check_split", "dev_seen"))
    metrics = {**check_from_items(items), "interplay_train_s": rec["train_s"]}
    return {"record": rec, "config": cfg, "captions": caps, "items": items, "metrics": metrics,
            "calls": chat.stats.requests, "cache_hits": chat.stats.cache_hits}


def check_table(m: dict[str, Any]):
    """The check's three shares with their intervals and majority lines, as notebook 01 shows them."""
    import pandas as pd
    return pd.DataFrame({w: {"share": m[f"interplay_{w}_acc"], "ci_low": m[f"interplay_{w}_ci_low"],
                             "ci_high": m[f"interplay_{w}_ci_high"], "majority line": m[f"interplay_{w}_majority"]}
                         for w in ("account", "type", "label")}).T
