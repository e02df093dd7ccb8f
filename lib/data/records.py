"""The records every dataset loads into, one schema per family (memes, explanations, MemeCap, MemeSense,
image-text alignment), the `Dataset` they come in, `DataError`, and the word split that alignment
benchmarks locate words with.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from PIL import Image


FHM_SPLITS = ("train", "dev_seen", "dev_unseen", "test_seen", "test_unseen")


HVLI_TYPES = ("000", "001", "010", "011", "100", "101", "110", "111")


HVLI_DIFFICULTY = {"000": "Easy", "011": "Easy", "101": "Easy", "111": "Easy", "100": "Normal", "010": "Normal",
                   "001": "Hard", "110": "Hard"}


HVLI_LABELS = {0: "NotHate", 1: "Racist", 2: "Sexist", 3: "Homophobe", 4: "Religion", 5: "OtherHate"}


class DataError(ValueError):
    """Bad input: the message names the file, the record and the field."""


# ----------------------------------------------------------------------------- record schemas
@dataclass
class MemeRecord:
    """A meme for classification. `label` is binary (1 = hateful/offensive/misogynous)."""
    id: str
    img_path: Path
    text: str
    label: int | None
    split: str
    captions: dict[str, str] = field(default_factory=dict)  # caption column -> caption (TRACE)
    meta: dict[str, Any] = field(default_factory=dict)      # dataset-specific fields (type, difficulty, ...)

    def image(self):
        return Image.open(self.img_path).convert("RGB")


@dataclass
class ExplanationRecord:
    id: str
    img_path: Path
    targets: list[str]
    reasonings: list[str]
    split: str

    def image(self):
        return Image.open(self.img_path).convert("RGB")


@dataclass
class MemeCapRecord:
    id: str
    img_path: Path
    title: str
    img_captions: list[str]
    meme_captions: list[str]
    metaphors: list[dict]
    split: str

    def image(self):
        return Image.open(self.img_path).convert("RGB")


@dataclass
class MemeSenseRecord:
    id: str
    img_path: Path
    commonsense: str
    intervention: str
    split: str = "all"

    def image(self):
        return Image.open(self.img_path).convert("RGB")


#: CLIP4DM's word split: spaces separate words, "." and "," are words of their own
CAPTION_WORD_RE = re.compile(r"[^\s.,]+|[.,]")


def caption_words(text: str) -> list[str]:
    """A caption's words as CLIP4DM splits them ("." and "," are words of their own)."""
    return CAPTION_WORD_RE.findall(text)


def normalize_word(w: str) -> str:
    """A word compared across tokenisations: lower case, punctuation stripped."""
    return re.sub(r"[^\w\-']", "", w.lower())


def swap_positions(foil: str, originals: Sequence[str], foil_word: str) -> tuple[list[int], bool]:
    """Where a one-word-swap foil differs from its original: the positions (among `caption_words`)
    of the swapped word, found by comparing with an original of the same length that differs in
    one place, holding the foil word. Without such an original the first occurrence of the foil
    word's string is used (second value False: located by string, not by position)."""
    fw = caption_words(foil)
    target = normalize_word(foil_word)
    for o in originals:
        ow = caption_words(o)
        if len(ow) != len(fw):
            continue
        diff = [k for k, (a, b) in enumerate(zip(fw, ow)) if normalize_word(a) != normalize_word(b)]
        if len(diff) == 1 and normalize_word(fw[diff[0]]) == target:
            return diff, True
    hits = [k for k, w in enumerate(fw) if normalize_word(w) == target]
    return hits[:1], False


def labelled_positions(caption: str, labels: Sequence[tuple[str, int]]) -> list[int]:
    """Positions among `caption_words(caption)` of the words a benchmark flags, aligning its own
    tokens (which may carry punctuation, or leave it out) to the caption's words in order."""
    words = caption_words(caption)
    flat = []
    for tok, m in labels:
        for w in caption_words(tok):
            if w not in (".", ","):
                flat.append((normalize_word(w), m))
    out, j = [], 0
    for k, w in enumerate(words):
        if w in (".", ","):
            continue
        if j < len(flat) and flat[j][0] == normalize_word(w):
            if flat[j][1]:
                out.append(k)
            j += 1
    return out


@dataclass
class AlignmentRecord:
    """An (image, caption) pair with its misalignment annotation.

    `misaligned_words`: the ground-truth misaligned words (empty for an aligned caption);
    `token_labels`: per-word (word, is_misaligned) where the benchmark gives them;
    `score`: a graded misalignment score (RichHF) or None.
    """
    id: str
    img_path: Path
    caption: str
    misaligned_words: list[str]
    references: list[str] = field(default_factory=list)
    token_labels: list[tuple[str, int]] = field(default_factory=list)
    group: str | None = None
    score: float | None = None
    split: str = "test"
    #: positions of the misaligned words among `caption_words(caption)` ("." and "," count as words);
    #: empty where the benchmark does not locate them
    misaligned_positions: list[int] = field(default_factory=list)

    @property
    def is_foil(self) -> bool:
        return bool(self.misaligned_words)

    def image(self):
        return Image.open(self.img_path).convert("RGB")


@dataclass
class Dataset:
    name: str
    root: Path
    records: list[Any]
    report: list[str] = field(default_factory=list)   # skipped records and why (strict=False)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.records)

    def split(self, *names: str) -> list[Any]:
        return [r for r in self.records if r.split in names]

    def to_frame(self):
        import pandas as pd
        rows = []
        for r in self.records:
            d = {k: v for k, v in r.__dict__.items() if k not in ("meta", "captions")}
            d.update(getattr(r, "meta", {}))
            d.update({f"caption:{k}": v for k, v in getattr(r, "captions", {}).items()})
            rows.append(d)
        return pd.DataFrame(rows)
