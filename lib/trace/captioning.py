"""TRACE captioning building blocks: grounding (tags), captioners, and TRACE JSON columns.

The captioning flow is grounding first (tags, then boxes for the tags), then a VLM writes a
caption from the image and the grounding. This module holds the parts that run in both
profiles:

- `ZeroShotTagger`: tags from an encoder's zero-shot image-text scores over a tag vocabulary
  (embedded: memeworld-clip over MemeWorld's object, colour and symbol words);
- `CropGrounder`: boxes for the tags by scoring image windows against each tag with the same
  encoder (embedded; a zero-shot localiser in the spirit of sliding-window CLIP), and
  `GroundingDinoGrounder`: GroundingDINO through transformers, prompted with the tags (paper);
- `grounded_prompt`: the captioner prompt with the grounding (tags and boxes) written into it;
- `caption_many`: captions for many images through any cached chat model (batched for local
  models, a thread pool for HTTP ones), so reruns and crashes cost nothing twice;
- `trace_records`: rows in the TRACE JSON format with one column per caption source.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from lib.compendium import sharding
from lib.compendium.artifacts import project_path
from lib.models.chat import GenParams, user
from lib.models.encoders import load_encoder
from lib.compendium.presets import default_device, resolve_model_path
from lib.compendium.prompts import prompt_line
from lib.evaluation.textmetrics import rouge_l

#: the captioner's question without grounding, and with it ({tags}: the detected objects)
DEFAULT_PROMPT = prompt_line("caption/describe.txt")
GROUNDED_PROMPT = prompt_line("caption/grounded.txt")


@dataclass
class ZeroShotTagger:
    """Tags whose zero-shot probability (softmax over the vocabulary) is at least `min_prob`,
    best first, at most `top_k`."""
    encoder: Any
    vocabulary: Sequence[str]
    prompt: str = "a photo of a {}"
    top_k: int = 4
    min_prob: float = 0.05

    def __post_init__(self):
        import torch
        with torch.no_grad():
            self._text = self.encoder.encode_texts([self.prompt.format(t) for t in self.vocabulary])

    def scores(self, images):
        import torch
        with torch.no_grad():
            img = self.encoder.encode_images(images)
            logits = self.encoder.logit_scale * img @ self._text.T
            if self.encoder.logit_bias is not None:
                logits = logits + self.encoder.logit_bias
        return logits.softmax(-1).float().cpu().numpy()

    def tags(self, images, batch_size: int = 128) -> list[list[tuple[str, float]]]:
        out = []
        for k in range(0, len(images), batch_size):
            probs = self.scores(list(images[k:k + batch_size]))
            for p in probs:
                order = np.argsort(-p)[: self.top_k]
                out.append([(self.vocabulary[i], float(p[i])) for i in order if p[i] >= self.min_prob])
        return out


# ----------------------------------------------------------------------------- boxes
def _windows(width: int, height: int, scales: Sequence[float], stride: float) -> list[tuple[int, int, int, int]]:
    out = []
    for s in scales:
        n = int(np.floor((1 - s) / stride + 1e-9)) + 1
        starts = np.linspace(0, 1 - s, n) if n > 1 else np.array([(1 - s) / 2])
        for fy in starts:
            for fx in starts:
                out.append((int(round(fx * width)), int(round(fy * height)),
                            int(round((fx + s) * width)), int(round((fy + s) * height))))
    return out


@dataclass
class CropGrounder:
    """Boxes for tags from an image-text encoder: every window (square crops of each `scales`
    fraction of the image, `stride` apart) is scored against every tag; a tag's box is its
    best-scoring window. Zero-shot and architecture-agnostic; coarser than a detector."""
    encoder: Any
    prompt: str = "a {}"
    scales: Sequence[float] = (0.4,)
    stride: float = 0.3
    batch_images: int = 32

    def __post_init__(self):
        self._text: dict[str, Any] = {}

    def _tag_embeddings(self, tags):
        import torch
        new = [t for t in dict.fromkeys(tags) if t not in self._text]
        if new:
            with torch.no_grad():
                for t, e in zip(new, self.encoder.encode_texts([self.prompt.format(t) for t in new])):
                    self._text[t] = e
        return torch.stack([self._text[t] for t in tags]) if tags else None

    def ground(self, images: Sequence, tags: Sequence[Sequence[str]]) -> list[list[dict[str, Any]]]:
        """One list per image of {"tag", "box" [x0, y0, x1, y1] in pixels, "score"} for its tags."""
        import torch
        if len(images) != len(tags):
            raise ValueError(f"CropGrounder.ground: {len(images)} images but {len(tags)} tag lists")
        out: list[list[dict[str, Any]]] = []
        for k in range(0, len(images), self.batch_images):
            chunk, chunk_tags = images[k:k + self.batch_images], tags[k:k + self.batch_images]
            wins = [_windows(*im.size, self.scales, self.stride) for im in chunk]
            crops = [im.crop(w) for im, ws in zip(chunk, wins) for w in ws]
            with torch.no_grad():
                emb = self.encoder.encode_images(crops) if crops else None
            at = 0
            for im, ws, tg in zip(chunk, wins, chunk_tags):
                e = emb[at:at + len(ws)]
                at += len(ws)
                if not tg:
                    out.append([])
                    continue
                sims = (e @ self._tag_embeddings(list(tg)).T).float().cpu().numpy()     # [windows, tags]
                best = sims.argmax(0)
                out.append([{"tag": t, "box": [float(v) for v in ws[int(b)]], "score": float(sims[b, j])}
                            for j, (t, b) in enumerate(zip(tg, best))])
        return out


def read_tag_list(path: str | Path) -> list[str]:
    """A tagger vocabulary file (RAM++'s ram_tag_list.txt: one tag per line), relative to the repository
    root unless absolute."""
    p = project_path(path)
    if not p.is_file():
        raise FileNotFoundError(f"tag_vocabulary_file: {p} does not exist (RAM++'s tag list, one tag per line)")
    tags = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not tags:
        raise ValueError(f"tag_vocabulary_file: {p} holds no tag")
    return tags


class GroundingDinoGrounder:
    """GroundingDINO (transformers `AutoModelForZeroShotObjectDetection`) prompted with the tags as
    "tag one. tag two.", as TRACE's captioning pipeline does; detected phrases are mapped back to
    the tag they name and boxes below `box_threshold` are dropped."""

    def __init__(self, model, processor, box_threshold: float = 0.35, text_threshold: float = 0.25,
                 max_boxes_per_tag: int = 2, device: str = "cpu"):
        self.model, self.processor, self.device = model, processor, device
        self.box_threshold, self.text_threshold, self.max_boxes_per_tag = box_threshold, text_threshold, max_boxes_per_tag

    @classmethod
    def from_pretrained(cls, model_id: str = "IDEA-Research/grounding-dino-base", revision: str | None = None,
                        device: str | None = None, **kw) -> "GroundingDinoGrounder":
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor
        device = device or default_device()
        rk = {"revision": revision} if revision else {}
        model_id = resolve_model_path(model_id)               # a hub id, or a local folder under the root
        model = AutoModelForZeroShotObjectDetection.from_pretrained(model_id, **rk).to(device).eval()
        return cls(model, AutoProcessor.from_pretrained(model_id, **rk), device=device, **kw)

    @staticmethod
    def _match(phrase: str, tags: Sequence[str]) -> str | None:
        p = phrase.strip().lower()
        if not p:
            return None
        for t in tags:
            if p == t.lower():
                return t
        cands = [t for t in tags if p in t.lower() or t.lower() in p]
        return max(cands, key=len) if cands else None

    def ground(self, images: Sequence, tags: Sequence[Sequence[str]]) -> list[list[dict[str, Any]]]:
        import torch
        if len(images) != len(tags):
            raise ValueError(f"GroundingDinoGrounder.ground: {len(images)} images but {len(tags)} tag lists")
        out = []
        for im, tg in zip(images, tags):
            if not tg:
                out.append([])
                continue
            text = ". ".join(t.lower() for t in tg) + "."
            inp = self.processor(images=im, text=text, return_tensors="pt").to(self.device)
            with torch.no_grad():
                res = self.model(**inp)
            r = self.processor.post_process_grounded_object_detection(
                res, inp["input_ids"], threshold=self.box_threshold, text_threshold=self.text_threshold,
                target_sizes=[im.size[::-1]])[0]
            labels = r["text_labels"] if "text_labels" in r else r["labels"]
            found: dict[str, list[dict[str, Any]]] = {}
            for box, score, lab in zip(r["boxes"].tolist(), r["scores"].tolist(), labels):
                t = self._match(str(lab), tg)
                if t is not None:
                    found.setdefault(t, []).append({"tag": t, "box": [float(v) for v in box], "score": float(score)})
            out.append([b for t in tg for b in sorted(found.get(t, []), key=lambda b: -b["score"])[: self.max_boxes_per_tag]])
        return out


def load_grounder(spec: dict[str, Any] | None, device: str | None = None):
    """A grounder from a profile spec: {"kind": "crops", "encoder": PRESET, "scales": [...], "stride": s}
    or {"kind": "grounding-dino", "model": HUB_ID, "revision": ..., "box_threshold": ...}; None: no boxes."""
    if not spec:
        return None
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind == "crops":
        enc = load_encoder(spec.pop("encoder"), device=device)
        return CropGrounder(enc, **spec)
    if kind == "grounding-dino":
        return GroundingDinoGrounder.from_pretrained(spec.pop("model", "IDEA-Research/grounding-dino-base"),
                                                     revision=spec.pop("revision", None), device=device, **spec)
    raise ValueError(f"grounder kind {kind!r} is not one of 'crops', 'grounding-dino'")


def position_word(box: Sequence[float], width: float) -> str:
    """left / middle / right from the box centre's horizontal third."""
    cx = (box[0] + box[2]) / 2 / width
    return "left" if cx < 1 / 3 else ("right" if cx > 2 / 3 else "middle")


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


# ----------------------------------------------------------------------------- prompts and columns
_PHRASE = {"left": "on the left", "middle": "in the middle", "right": "on the right"}


def _grounding_list(tags, boxes=None, width: float | None = None, with_coords: bool = True) -> list[str]:
    if not boxes:
        return [t for t, _ in tags]
    items = []
    for b in sorted(boxes, key=lambda b: b["box"][0]):
        where = _PHRASE[position_word(b["box"], width)] if width else ""
        coords = " [" + ", ".join(str(int(round(v))) for v in b["box"]) + "]" if with_coords else ""
        items.append(" ".join(x for x in (b["tag"] + coords, where) if x))
    return items


def grounded_prompt(tags: Sequence[tuple[str, float]], template: str = GROUNDED_PROMPT,
                    boxes: Sequence[dict[str, Any]] | None = None, width: float | None = None) -> str:
    """The captioner prompt with the grounding: tags, or tags with pixel boxes and their position."""
    items = _grounding_list(tags, boxes, width)
    return template.format(tags="; ".join(items) if items else "none")


def tag_caption(tags: Sequence[tuple[str, float]], boxes: Sequence[dict[str, Any]] | None = None,
                width: float | None = None) -> str:
    """The grounding written as a caption candidate of its own (left to right when boxed)."""
    items = _grounding_list(tags, boxes, width, with_coords=False)
    return "objects: " + ", ".join(items) if items else ""


def caption_many(chat, images: Sequence, prompts: Sequence[str], max_new_tokens: int = 60,
                 temperature: float = 0.0, desc: str = "caption") -> list[Any]:
    """One ChatResult per image (cached; batched or threaded by the chat model)."""
    if len(images) != len(prompts):
        raise ValueError(f"caption_many: {len(images)} images but {len(prompts)} prompts")
    convs = [[user(im, p)] for im, p in zip(images, prompts)]     # under a launch each process generates its share
    return sharding.generate(chat, convs, GenParams(temperature=temperature, max_new_tokens=max_new_tokens), desc=desc)


def trace_records(records, columns: dict[str, Sequence[str]]) -> list[dict[str, Any]]:
    """TRACE JSON rows {img, text, label, split, <caption columns>} for MemeRecords; an empty
    caption (a failed or refused request) is left out of that row so the model masks it."""
    rows = []
    for i, r in enumerate(records):
        row = {"id": r.id, "img": str(r.img_path), "text": r.text, "label": r.label, "split": r.split}
        for col, caps in columns.items():
            if caps[i]:
                row[col] = caps[i]
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- one dataset, end to end
def caption_dataset(records, tagger, grounder, chats: dict[str, Any], captioners: dict[str, dict[str, Any]],
                    max_new_tokens: int = 60, include_tag_caption: bool = True, name: str = "",
                    batch_size: int = 256) -> dict[str, Any]:
    """Tag, box and caption `records` (MemeRecords): read every image (unreadable ones reported and
    kept with the meme text as their only candidate), tag and ground them in batches, caption them
    with each captioner (the grounding in the prompt where its spec says `grounded`), and return
    the TRACE rows (`rows`, each with its boxes under `grounding`) plus what the notebook inspects:
    images, readable indices `ok`, tags, boxes, caption columns, unreadable `bad`, failures."""
    images, bad = [], []
    for r in records:
        try:
            images.append(r.image())
        except (OSError, ValueError) as e:
            images.append(None)
            bad.append((r.id, str(r.img_path), type(e).__name__))
    ok = [i for i, im in enumerate(images) if im is not None]
    tags: list[list] = [[] for _ in records]
    boxes: list[list] = [[] for _ in records]
    for s in tqdm(range(0, len(ok), batch_size), desc=f"{name}: tags and boxes"):
        idx = ok[s:s + batch_size]
        t = tagger.tags([images[i] for i in idx])
        b = grounder.ground([images[i] for i in idx], [[x for x, _ in tt] for tt in t]) if grounder else [[] for _ in idx]
        for i, tt, bb in zip(idx, t, b):
            tags[i], boxes[i] = tt, bb
    columns: dict[str, list[str]] = {}
    failures: dict[str, dict[str, int]] = {}
    for col, spec in captioners.items():
        prompts = [grounded_prompt(tags[i], boxes=boxes[i], width=images[i].width) if spec.get("grounded")
                   else DEFAULT_PROMPT for i in ok]
        res = caption_many(chats[col], [images[i] for i in ok], prompts, max_new_tokens=max_new_tokens,
                           desc=f"{name}: {col}")
        caps = [""] * len(records)
        for i, r in zip(ok, res):
            caps[i] = r.text if r.ok else ""
        columns[col] = caps
        failures[col] = {s: sum(r.status == s for r in res) for s in ("failed", "refused", "blocked")}
    if include_tag_caption:
        columns["tag_caption"] = [tag_caption(tags[i], boxes[i], images[i].width if images[i] else None)
                                  for i in range(len(records))]
    rows = trace_records(records, columns)
    for row, b in zip(rows, boxes):
        row["grounding"] = b
    return {"records": records, "images": images, "ok": ok, "tags": tags, "boxes": boxes, "columns": columns,
            "bad": bad, "failures": failures, "rows": rows}


def captioned_table(runs: dict[str, dict[str, Any]]):
    """One row per meme of every `caption_dataset` run: dataset, id, split, whether its image was
    readable (metrics.json's counts, recomputable from results/)."""
    import pandas as pd
    bad = {(name, str(b[0])) for name, r in runs.items() for b in r["bad"]}
    return pd.DataFrame([{"dataset": name, "id": str(rec.id), "split": rec.split, "readable": (name, str(rec.id)) not in bad}
                         for name, r in runs.items() for rec in r["records"]])


def caption_scores(run: dict[str, Any], gold: dict[str, dict[str, Any]], object_tag, object_box):
    """Per-item scores of one `caption_dataset` run against MemeWorld's gold, the files
    `caption_quality_from_scores` reads (notebook 01 writes them as caption_scores.csv and
    box_scores.csv): one row per meme with gold (its split, the ROUGE-L F of each caption column,
    its tags' true / false positives and misses against the gold objects), and one row per box whose
    tag names a gold object (its best IoU with that object's box, whether it lies in the right third)."""
    import pandas as pd
    rows, boxes = [], []
    for k, r in enumerate(run["records"]):
        if r.id not in gold:
            continue
        g = gold[r.id]
        row: dict[str, Any] = {"id": r.id, "split": r.split}
        for col, caps in run["columns"].items():
            c = caps[k]
            row[f"rouge_l_{col}"] = float(rouge_l([c], [g["gold_caption"]])[0]) if c else float("nan")
        im = run["images"][k]
        if im is not None:
            objs = g["objects"]
            phrases = {object_tag(o) for o in objs}
            got = {x for x, _ in run["tags"][k]}
            row.update(tag_tp=len(got & phrases), tag_fp=len(got - phrases), tag_fn=len(phrases - got))
            for b in run["boxes"][k]:
                match = [o for o in objs if object_tag(o) == b["tag"]]
                if match:
                    best = max(match, key=lambda o: box_iou(b["box"], object_box(o["position"], im.width)))
                    boxes.append({"id": r.id, "tag": b["tag"],
                                  "iou": box_iou(b["box"], object_box(best["position"], im.width)),
                                  "in_third": position_word(b["box"], im.width) in {o["position"] for o in match}})
        rows.append(row)
    return pd.DataFrame(rows), pd.DataFrame(boxes, columns=["id", "tag", "iou", "in_third"])


def caption_quality_from_scores(scores, boxes) -> dict[str, float]:
    """Caption and grounding quality from `caption_scores`' two tables: ROUGE-L F of every caption
    column on held-out memes (dev and test) and on train (mean over the memes with that caption);
    tag precision / recall against the gold objects; each correct tag's box against the drawn
    object's (IoU, share with IoU >= 0.5, share in the right third)."""
    m: dict[str, float] = {}
    held = scores["split"] != "train"
    for col in [c for c in scores.columns if c.startswith("rouge_l_")]:
        for part, keep in (("", held), ("_train", ~held)):
            v = scores.loc[keep, col].dropna()
            m[f"{col}{part}"] = float(v.mean()) if len(v) else float("nan")
    if "tag_tp" in scores:
        tp, fp, fn = (int(scores[c].fillna(0).sum()) for c in ("tag_tp", "tag_fp", "tag_fn"))
        m["tag_precision"] = tp / max(1, tp + fp)
        m["tag_recall"] = tp / max(1, tp + fn)
    if len(boxes):
        iou = boxes["iou"].astype(float).to_numpy()
        m.update({"box_iou": float(np.mean(iou)), "box_hit_rate": float(np.mean(iou >= 0.5)),
                  "box_position_accuracy": float(np.mean(boxes["in_third"].astype(bool))), "n_boxes_scored": len(iou)})
    return m


def caption_quality(run: dict[str, Any], gold: dict[str, dict[str, Any]], object_tag, object_box) -> dict[str, float]:
    """caption_quality_from_scores of caption_scores: the run's quality against MemeWorld's gold."""
    return caption_quality_from_scores(*caption_scores(run, gold, object_tag, object_box))
