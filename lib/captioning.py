"""TRACE captioning building blocks: grounding (tags), captioners, and TRACE JSON columns.

The captioning flow is grounding first (tags, then boxes for the tags), then a VLM writes a
caption from the image and the grounding. This module holds the parts that run in both
profiles:

- `ZeroShotTagger`: tags from an encoder's zero-shot image-text scores over a tag vocabulary
  (embedded: memeworld-clip over MemeWorld's object, colour and symbol words);
- `grounded_prompt`: the captioner prompt with the grounding written into it;
- `caption_many`: captions for many images through any cached chat model (batched for local
  models, a thread pool for HTTP ones), so reruns and crashes cost nothing twice;
- `trace_records`: rows in the TRACE JSON format with one column per caption source.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

DEFAULT_PROMPT = "Describe the image."
GROUNDED_PROMPT = ("Describe the image. Detected objects: {tags}. Mention each object that is really "
                   "visible, with its colour and position.")


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


def grounded_prompt(tags: Sequence[tuple[str, float]], template: str = GROUNDED_PROMPT) -> str:
    return template.format(tags=", ".join(t for t, _ in tags) if tags else "none")


def tag_caption(tags: Sequence[tuple[str, float]]) -> str:
    """The grounding written as a caption candidate of its own."""
    return "objects: " + ", ".join(t for t, _ in tags) if tags else ""


def caption_many(chat, images: Sequence, prompts: Sequence[str], max_new_tokens: int = 60,
                 temperature: float = 0.0, desc: str = "caption") -> list[Any]:
    """One ChatResult per image (cached; batched or threaded by the chat model)."""
    from lib.chat import GenParams, user
    if len(images) != len(prompts):
        raise ValueError(f"caption_many: {len(images)} images but {len(prompts)} prompts")
    convs = [[user(im, p)] for im, p in zip(images, prompts)]
    return chat.generate_many(convs, GenParams(temperature=temperature, max_new_tokens=max_new_tokens), desc=desc)


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
