"""MemeWorld: a procedurally generated meme benchmark that stands in for the real datasets.

Every meme is a scene of objects (benign objects, fictional group sigils, a crossed-out
sigil, sludge rats, a myth stamp, the emblem of a fictional hate gang) with its text
rendered on the image as real memes have. Its labels follow the SMI scheme of H-VLI:
a text label (the text alone), an image label (the image alone) and a final label
(the meme), so every meme has an interaction type "{t}{i}{m}". The rules:

=====  ====================================  =====================================  =====
type   text family                           image family                           final
=====  ====================================  =====================================  =====
000    topic / pest / pointer / mention /    plain objects (pest text: sludge       0
       pride                                 rats)
001    pointer ("my new X neighbours be      sludge rats (benign alone)             1
       like")                                                                       (emergent)
010    support ("we scrubbed this off")      crossed-out sigil of X                 0
011    mention / pride                       crossed-out sigil of X / gang emblem   1
100    hate against X                        myth stamp (fact check)                0
101    hate against X / generic hate         plain objects                          1
110    generic hate ("they are vermin")      emblem of the Grey Hand hate gang      0
                                                                                    (counter-speech)
111    hate against X / generic hate         crossed-out sigil of X                 1
=====  ====================================  =====================================  =====

The mixture is chosen so that a reader of one modality cannot solve the emergent
types: the pointer texts occur more often with benign pictures than with rats, rats
occur more often with pest-control texts than with pointer texts, generic hate occurs
more often with a hateful meme than as counter-speech, and the gang emblem more often
in propaganda than in counter-speech. `unimodal_bayes_readers` measures this on the data.

Groups, symbols and the hate gang are fictional. Multiclass targets 1-5 mirror
H-VLI's indices (Racist, Sexist, Homophobe, Religion, OtherHate) on fictional
categories (lineage, caste, bond, creed, other).

"Unseen" splits (dev_unseen, test_unseen) hold (group, interaction type) combinations
that never occur in train / dev_seen / test_seen, to test compositional
generalisation. The same seed gives byte-identical files.

Command: `python -m lib.data.memeworld --out DIR --seed S --n N`.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from tqdm.auto import tqdm

from lib.data import render
from lib.compendium.artifacts import write_json, write_text
from lib.data.datasets import MemeRecord
from lib.data.injection import build_injection_set

# ----------------------------------------------------------------------------- the world
CATEGORY_NAMES = {0: "none", 1: "lineage", 2: "caste", 3: "bond", 4: "creed", 5: "other"}
#: H-VLI label strings, index for index; MemeWorld's categories stand in for them.
HVLI_LABEL_STR = {0: "NotHate", 1: "Racist", 2: "Sexist", 3: "Homophobe", 4: "Religion", 5: "OtherHate"}

# name: (plural, adjective, category, symbol)
GROUPS: dict[str, tuple[str, str, int, str]] = {
    "zorblin": ("Zorblins", "Zorblin", 1, "zigzag"),
    "quaxi": ("Quaxi", "Quaxi", 1, "triad"),
    "tidecaller": ("Tidecallers", "Tidecaller", 2, "wave"),
    "emberkin": ("Emberkin", "Emberkin", 2, "flame"),
    "twinbonder": ("Twinbonders", "Twinbonder", 3, "rings"),
    "spiralist": ("Spiralists", "Spiralist", 4, "spiral"),
    "glimmerfolk": ("Glimmerfolk", "Glimmerfolk", 4, "starburst"),
    "vellani": ("Vellani", "Vellani", 5, "hex"),
}
SYMBOLS = [g[3] for g in GROUPS.values()]
GANG = "Grey Hand"

BENIGN_OBJECTS = ["sun", "tree", "flower", "cake", "house", "boat", "ball", "cup"]
#: objects that only nocaps-FOIL's scenes draw: no meme, caption or training pair ever shows or names
#: one, so memeworld-clip and memeworld-vlm never see them (nocaps' novel objects)
NOVEL_OBJECTS = ["kite", "lamp", "fish", "bell", "leaf"]
COLOURED_OBJECTS = BENIGN_OBJECTS + NOVEL_OBJECTS
#: nocaps' domains by how many of a scene's objects are novel: none, some, all
NOCAPS_DOMAINS = ("in-domain", "near-domain", "out-domain")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (214, 40, 40), "green": (46, 160, 67), "blue": (40, 90, 214), "yellow": (240, 200, 30),
    "purple": (130, 60, 180), "orange": (245, 130, 20), "pink": (240, 120, 180), "black": (25, 25, 25),
}
BACKGROUNDS = [(235, 235, 225), (220, 232, 245), (240, 228, 210), (225, 240, 225), (245, 235, 240)]
POSITIONS = {"left": 0.18, "middle": 0.5, "right": 0.82}
POSITION_PHRASE = {"left": "on the left", "middle": "in the middle", "right": "on the right"}

TEXTS: dict[str, list[str]] = {
    "topic": ["sunny afternoon at the lake", "when the cake finally comes out right", "monday again, somehow",
              "weekend plans: absolutely nothing", "me pretending to water the garden",
              "the view from my window today"],
    "pest": ["pest control day at the old farm", "found these in the barn again", "the cat is not doing its job",
             "rain brings them out of the drains", "why the grain store is empty"],
    "pointer": ["my new {adj} neighbours be like", "when the {pl} move in next door", "{pl} at the market be like",
                "meet the {adj} family down the street", "a typical {adj} household"],
    "mention": ["the {adj} quarter this morning", "{adj} street festival, day two", "spotted near the {adj} market",
                "walking past the {adj} hall"],
    "support": ["we scrubbed this off the {adj} hall today", "vandals hit the {adj} shrine, neighbours cleaned it up",
                "this does not belong on a {adj} door", "standing with our {adj} friends after the vandalism"],
    "pride": ["our people, our pride", "join us this weekend", "the meeting starts at dusk", "stand with the hand"],
    "hate": ["{pl} are vermin, drive them out", "no {pl} should be allowed in this town",
             "{pl} ruin everything they touch", "send every last {adj} away"],
    "hate_generic": ["they are vermin, drive them out", "their kind ruins everything",
                     "get rid of every last one of them", "they should never have been let in"],
}
TEXT_LABEL = {"topic": 0, "pest": 0, "pointer": 0, "mention": 0, "support": 0, "pride": 0, "hate": 1,
              "hate_generic": 1}
IMAGE_LABEL = {"plain": 0, "vermin": 0, "defaced": 1, "debunk": 0, "gang": 1}

# (type, text family, image family, share of all memes)
MIXTURE: list[tuple[str, str, str, float]] = [
    ("000", "topic", "plain", 0.03), ("000", "pest", "vermin", 0.12), ("000", "pointer", "plain", 0.13),
    ("000", "mention", "plain", 0.05), ("000", "pride", "plain", 0.04),
    ("001", "pointer", "vermin", 0.08),
    ("010", "support", "defaced", 0.06),
    ("011", "mention", "defaced", 0.04), ("011", "pride", "gang", 0.12),
    ("100", "hate", "debunk", 0.06),
    ("101", "hate", "plain", 0.06), ("101", "hate_generic", "plain", 0.04),
    ("110", "hate_generic", "gang", 0.08),
    ("111", "hate", "defaced", 0.03), ("111", "hate_generic", "defaced", 0.08),
]
#: (group, type) combinations held out of train/dev_seen/test_seen: the "unseen" splits test them.
UNSEEN_COMBOS = {("quaxi", "001"), ("emberkin", "010"), ("vellani", "011"), ("twinbonder", "100"),
                 ("glimmerfolk", "101"), ("tidecaller", "111")}
DIFFICULTY = {"000": "Easy", "011": "Easy", "101": "Easy", "111": "Easy", "100": "Normal", "010": "Normal",
              "001": "Hard", "110": "Hard"}
SPLIT_SHARES = {"train": 0.70, "dev_seen": 0.05, "dev_unseen": 0.05, "test_seen": 0.10, "test_unseen": 0.10}
SEEN_SPLITS = ("train", "dev_seen", "test_seen")


@dataclass
class SceneObject:
    kind: str                 # a benign object name, "sigil", "defaced", "vermin", "stamp", "hand"
    position: str             # left / middle / right
    colour: str | None = None  # benign objects only
    symbol: str | None = None  # sigils only
    key: bool = False         # carries the image's meaning (not a filler)

    def phrase(self) -> str:
        if self.kind in COLOURED_OBJECTS:
            return f"a {self.colour} {self.kind}"
        return {"sigil": f"a {self.symbol} sigil", "defaced": f"a crossed-out {self.symbol} sigil",
                "vermin": "a brown sludge rat", "stamp": "a green myth stamp", "hand": "a grey hand emblem"}[self.kind]


@dataclass
class MemeSpec:
    """Everything about one meme; rendering is a pure function of this record."""
    id: int
    split: str
    type: str
    text_family: str
    image_family: str
    group: str | None
    text: str
    objects: list[SceneObject]
    background: int
    render_seed: int
    label_noise_flip: bool = False
    confounder_of: int | None = None   # id of the hateful meme this benign confounder mirrors
    confounder_kind: str | None = None  # "same_image" or "same_text"
    scene_id: int = 0                  # memes sharing a scene_id share their picture
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def text_label(self) -> int:
        return int(self.type[0])

    @property
    def image_label(self) -> int:
        return int(self.type[1])

    @property
    def final_label_clean(self) -> int:
        return int(self.type[2])

    @property
    def final_label(self) -> int:
        return self.final_label_clean ^ int(self.label_noise_flip)


# ----------------------------------------------------------------------------- sampling
def _fill_text(rng: np.random.Generator, family: str, group: str | None) -> str:
    tpl = TEXTS[family][rng.integers(len(TEXTS[family]))]
    if group is None:
        return tpl
    pl, adj, _, _ = GROUPS[group]
    return tpl.format(pl=pl, adj=adj)


def _scene(rng: np.random.Generator, family: str, group: str | None) -> list[SceneObject]:
    """Key objects for the image family plus 1-2 benign fillers, on distinct positions."""
    slots = list(POSITIONS)
    rng.shuffle(slots)
    objs: list[SceneObject] = []
    symbol = GROUPS[group][3] if group else SYMBOLS[rng.integers(len(SYMBOLS))]
    if family == "plain":
        if rng.random() < 0.4:  # a respectful sigil: presence of a sigil alone is not hateful
            objs.append(SceneObject("sigil", slots.pop(), symbol=symbol, key=True))
    elif family == "vermin":
        objs.append(SceneObject("vermin", slots.pop(), key=True))
    elif family == "defaced":
        objs.append(SceneObject("defaced", slots.pop(), symbol=symbol, key=True))
    elif family == "debunk":
        objs.append(SceneObject("stamp", slots.pop(), key=True))
    elif family == "gang":
        objs.append(SceneObject("hand", slots.pop(), key=True))
    n_fill = 1 + int(rng.random() < 0.5) if objs else 2 + int(rng.random() < 0.3)
    for _ in range(min(n_fill, len(slots))):
        objs.append(SceneObject(BENIGN_OBJECTS[rng.integers(len(BENIGN_OBJECTS))], slots.pop(),
                                colour=list(COLOURS)[rng.integers(len(COLOURS))]))
    return sorted(objs, key=lambda o: POSITIONS[o.position])


def scene_caption(objects: list[SceneObject]) -> str:
    """Gold literal caption, objects left to right: 'a red sun on the left and ...'."""
    parts = [f"{o.phrase()} {POSITION_PHRASE[o.position]}" for o in objects]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _pick_group(rng: np.random.Generator, ttype: str, split: str) -> str:
    names = list(GROUPS)
    if split not in SEEN_SPLITS:
        held = [g for g, t in UNSEEN_COMBOS if t == ttype]
        if held:
            return held[0]
    allowed = [g for g in names if (g, ttype) not in UNSEEN_COMBOS]
    return allowed[rng.integers(len(allowed))]


def _needs_group(text_family: str, image_family: str) -> bool:
    return text_family in ("pointer", "mention", "support", "hate") or image_family == "defaced"


#: For a hateful meme's benign confounders: the text that makes its picture benign, and the
#: picture that makes its text benign (FHM's construction).
CONFOUNDER_TEXT = {"vermin": "pest", "defaced": "support", "plain": "topic"}
CONFOUNDER_IMAGE = {"pointer": "plain", "mention": "plain", "pride": "plain", "hate": "debunk"}
TYPE_OF = {(tf, imf): t for t, tf, imf, _ in MIXTURE}


def sample_specs(n: int, seed: int, label_noise: float = 0.02, confounder_rate: float = 0.15) -> list[MemeSpec]:
    """Sample n meme records (confounders included) deterministically from `seed`."""
    rng = np.random.default_rng(seed)
    shares = np.array([m[3] for m in MIXTURE])
    shares = shares / shares.sum()
    split_names = list(SPLIT_SHARES)
    split_p = np.array(list(SPLIT_SHARES.values()))
    specs: list[MemeSpec] = []
    scene_counter = 0

    def make(split: str, ttype: str, tf: str, imf: str, group: str | None, objects=None, text=None,
             conf_of=None, conf_kind=None, scene_id=None) -> MemeSpec:
        nonlocal scene_counter
        if objects is None:
            objects = _scene(rng, imf, group)
            scene_counter += 1
            scene_id = scene_counter
        return MemeSpec(id=0, split=split, type=ttype, text_family=tf, image_family=imf, group=group,
                        text=text if text is not None else _fill_text(rng, tf, group), objects=objects,
                        background=int(rng.integers(len(BACKGROUNDS))), render_seed=int(rng.integers(2**31)),
                        label_noise_flip=bool(rng.random() < label_noise), confounder_of=conf_of,
                        confounder_kind=conf_kind, scene_id=int(scene_id))

    while len(specs) < n:
        split = split_names[rng.choice(len(split_names), p=split_p)]
        ttype, tf, imf, _ = MIXTURE[rng.choice(len(MIXTURE), p=shares)]
        group = _pick_group(rng, ttype, split) if _needs_group(tf, imf) else None
        base = make(split, ttype, tf, imf, group)
        specs.append(base)
        if base.final_label_clean == 1 and split in SEEN_SPLITS and rng.random() < confounder_rate \
                and len(specs) + 2 <= n:
            idx = len(specs) - 1
            # same picture, a text that makes it benign
            tf2 = CONFOUNDER_TEXT.get(imf)
            t2 = TYPE_OF.get((tf2, imf)) if tf2 else None
            g2 = group if tf2 and _needs_group(tf2, imf) else None
            if t2 is not None and t2[2] == "0" and (g2, t2) not in UNSEEN_COMBOS:
                specs.append(make(split, t2, tf2, imf, g2, objects=base.objects, conf_of=idx,
                                  conf_kind="same_image", scene_id=base.scene_id))
            # same text, a picture that makes it benign
            imf2 = CONFOUNDER_IMAGE.get(tf)
            t3 = TYPE_OF.get((tf, imf2)) if imf2 else None
            if t3 is not None and t3[2] == "0" and (group, t3) not in UNSEEN_COMBOS and len(specs) < n:
                specs.append(make(split, t3, tf, imf2, group, text=base.text, conf_of=idx, conf_kind="same_text"))
    specs = specs[:n]
    # FHM-like 5-digit ids, in a shuffled order so ids reveal nothing about type or split
    order = rng.permutation(len(specs))
    ids = {old: 10000 + int(new) for new, old in enumerate(order)}
    for i, s in enumerate(specs):
        s.id = ids[i]
        if s.confounder_of is not None:
            s.confounder_of = ids[s.confounder_of]
    return specs


# ----------------------------------------------------------------------------- rendering
def _draw_object(draw, obj: SceneObject, cx: float, cy: float, r: float) -> None:
    col = COLOURS.get(obj.colour or "", (30, 30, 30))
    ink = (20, 20, 60)
    k = obj.kind
    box = [cx - r, cy - r, cx + r, cy + r]
    if k == "sun":
        draw.ellipse([cx - r * .6, cy - r * .6, cx + r * .6, cy + r * .6], fill=col)
        for a in np.linspace(0, 2 * np.pi, 8, endpoint=False):
            draw.line([cx + np.cos(a) * r * .7, cy + np.sin(a) * r * .7, cx + np.cos(a) * r, cy + np.sin(a) * r],
                      fill=col, width=max(2, int(r / 6)))
    elif k == "tree":
        draw.polygon([(cx, cy - r), (cx - r * .8, cy + r * .4), (cx + r * .8, cy + r * .4)], fill=col)
        draw.rectangle([cx - r * .15, cy + r * .4, cx + r * .15, cy + r], fill=(110, 70, 30))
    elif k == "flower":
        for a in np.linspace(0, 2 * np.pi, 5, endpoint=False):
            px, py = cx + np.cos(a) * r * .5, cy + np.sin(a) * r * .5
            draw.ellipse([px - r * .4, py - r * .4, px + r * .4, py + r * .4], fill=col)
        draw.ellipse([cx - r * .25, cy - r * .25, cx + r * .25, cy + r * .25], fill=(250, 230, 80))
    elif k == "cake":
        draw.rectangle([cx - r * .8, cy - r * .1, cx + r * .8, cy + r * .8], fill=col)
        draw.rectangle([cx - r * .8, cy - r * .3, cx + r * .8, cy - r * .1], fill=(255, 255, 255))
        draw.rectangle([cx - r * .08, cy - r * .9, cx + r * .08, cy - r * .3], fill=(250, 200, 60))
    elif k == "house":
        draw.rectangle([cx - r * .7, cy - r * .1, cx + r * .7, cy + r * .9], fill=col)
        draw.polygon([(cx - r * .9, cy - r * .1), (cx, cy - r * .9), (cx + r * .9, cy - r * .1)], fill=(120, 50, 40))
    elif k == "boat":
        draw.polygon([(cx - r, cy + r * .2), (cx + r, cy + r * .2), (cx + r * .6, cy + r * .8),
                      (cx - r * .6, cy + r * .8)], fill=col)
        draw.polygon([(cx, cy - r), (cx, cy + r * .1), (cx + r * .7, cy + r * .1)], fill=(250, 250, 250))
    elif k == "ball":
        draw.ellipse(box, fill=col)
        draw.arc([cx - r * .6, cy - r, cx + r * .6, cy + r], 90, 270, fill=(255, 255, 255), width=max(2, int(r / 7)))
    elif k == "cup":
        draw.rectangle([cx - r * .6, cy - r * .6, cx + r * .4, cy + r * .8], fill=col)
        draw.arc([cx + r * .1, cy - r * .3, cx + r * .9, cy + r * .4], 270, 90, fill=col, width=max(2, int(r / 5)))
    elif k == "kite":
        draw.polygon([(cx, cy - r), (cx + r * .6, cy - r * .1), (cx, cy + r * .6), (cx - r * .6, cy - r * .1)], fill=col)
        draw.line([cx, cy - r, cx, cy + r * .6], fill=(250, 250, 250), width=max(1, int(r / 10)))
        draw.line([cx, cy + r * .6, cx - r * .3, cy + r * .8, cx + r * .1, cy + r], fill=ink, width=max(1, int(r / 10)))
    elif k == "lamp":
        draw.polygon([(cx - r * .35, cy - r * .9), (cx + r * .35, cy - r * .9), (cx + r * .7, cy - r * .2),
                      (cx - r * .7, cy - r * .2)], fill=col)
        draw.rectangle([cx - r * .07, cy - r * .2, cx + r * .07, cy + r * .7], fill=(60, 60, 60))
        draw.rectangle([cx - r * .45, cy + r * .7, cx + r * .45, cy + r * .85], fill=(60, 60, 60))
    elif k == "fish":
        draw.ellipse([cx - r * .8, cy - r * .45, cx + r * .4, cy + r * .45], fill=col)
        draw.polygon([(cx + r * .3, cy), (cx + r, cy - r * .5), (cx + r, cy + r * .5)], fill=col)
        draw.ellipse([cx - r * .55, cy - r * .15, cx - r * .38, cy + r * .02], fill=(0, 0, 0))
    elif k == "bell":
        draw.chord([cx - r * .7, cy - r * .9, cx + r * .7, cy + r * .5], 180, 360, fill=col)
        draw.rectangle([cx - r * .7, cy - r * .2, cx + r * .7, cy + r * .5], fill=col)
        draw.rectangle([cx - r * .85, cy + r * .5, cx + r * .85, cy + r * .65], fill=col)
        draw.ellipse([cx - r * .18, cy + r * .6, cx + r * .18, cy + r * .95], fill=(60, 60, 60))
    elif k == "leaf":
        draw.ellipse([cx - r * .45, cy - r * .9, cx + r * .45, cy + r * .6], fill=col)
        draw.line([cx, cy - r * .8, cx, cy + r], fill=(90, 60, 30), width=max(2, int(r / 8)))
    elif k in ("sigil", "defaced"):
        _draw_symbol(draw, obj.symbol or "hex", cx, cy, r, ink)
        if k == "defaced":
            w = max(3, int(r / 4))
            draw.line([cx - r, cy - r, cx + r, cy + r], fill=(220, 20, 20), width=w)
            draw.line([cx - r, cy + r, cx + r, cy - r], fill=(220, 20, 20), width=w)
    elif k == "vermin":
        brown = (120, 80, 40)
        draw.ellipse([cx - r * .8, cy - r * .4, cx + r * .5, cy + r * .5], fill=brown)
        draw.ellipse([cx + r * .3, cy - r * .35, cx + r * .9, cy + r * .2], fill=brown)
        draw.ellipse([cx + r * .45, cy - r * .6, cx + r * .7, cy - r * .25], fill=brown)
        draw.line([cx - r * .8, cy + r * .1, cx - r, cy + r * .8], fill=brown, width=max(2, int(r / 8)))
        draw.ellipse([cx + r * .62, cy - r * .15, cx + r * .72, cy - r * .05], fill=(0, 0, 0))
    elif k == "stamp":
        g = (30, 150, 70)
        draw.polygon([(cx - r * .8, cy - r * .8), (cx + r * .8, cy - r * .8), (cx + r * .8, cy + r * .1),
                      (cx, cy + r), (cx - r * .8, cy + r * .1)], fill=g)
        draw.line([cx - r * .4, cy, cx - r * .05, cy + r * .35, cx + r * .5, cy - r * .4], fill=(255, 255, 255),
                  width=max(2, int(r / 5)))
    elif k == "hand":
        grey = (120, 120, 125)
        draw.rectangle([cx - r * .55, cy - r * .1, cx + r * .45, cy + r * .9], fill=grey)
        for i in range(4):
            x0 = cx - r * .55 + i * r * .26
            draw.rectangle([x0, cy - r * .9, x0 + r * .2, cy - r * .1], fill=grey)
        draw.polygon([(cx + r * .45, cy + r * .2), (cx + r * .95, cy - r * .3), (cx + r * .45, cy + r * .55)], fill=grey)
    else:
        raise ValueError(f"unknown scene object kind {k!r}")


def _draw_symbol(draw, sym: str, cx: float, cy: float, r: float, ink) -> None:
    w = max(2, int(r / 6))
    if sym == "zigzag":
        pts = [(cx - r * .9 + i * r * .45, cy + (r * .6 if i % 2 else -r * .6)) for i in range(5)]
        draw.line(pts, fill=ink, width=w)
    elif sym == "triad":
        for dx, dy in ((0, -.5), (-.5, .4), (.5, .4)):
            draw.ellipse([cx + dx * r - r * .28, cy + dy * r - r * .28, cx + dx * r + r * .28, cy + dy * r + r * .28], fill=ink)
    elif sym == "wave":
        for off in (-.4, .3):
            xs = np.linspace(-r * .9, r * .9, 12)
            draw.line([(cx + x, cy + off * r + np.sin(x / r * 3.5) * r * .25) for x in xs], fill=ink, width=w)
    elif sym == "flame":
        draw.polygon([(cx, cy - r), (cx + r * .6, cy + r * .2), (cx + r * .3, cy + r * .9), (cx - r * .3, cy + r * .9),
                      (cx - r * .6, cy + r * .2)], fill=ink)
        draw.polygon([(cx, cy - r * .1), (cx + r * .25, cy + r * .5), (cx - r * .25, cy + r * .5)], fill=(240, 240, 240))
    elif sym == "rings":
        draw.ellipse([cx - r * .9, cy - r * .45, cx + r * .1, cy + r * .55], outline=ink, width=w)
        draw.ellipse([cx - r * .1, cy - r * .45, cx + r * .9, cy + r * .55], outline=ink, width=w)
    elif sym == "spiral":
        t = np.linspace(0, 4 * np.pi, 40)
        draw.line([(cx + np.cos(a) * r * a / (4 * np.pi), cy + np.sin(a) * r * a / (4 * np.pi)) for a in t],
                  fill=ink, width=w)
    elif sym == "starburst":
        pts = []
        for i, a in enumerate(np.linspace(-np.pi / 2, 1.5 * np.pi, 16, endpoint=False)):
            rr = r if i % 2 == 0 else r * .4
            pts.append((cx + np.cos(a) * rr, cy + np.sin(a) * rr))
        draw.polygon(pts, fill=ink)
    elif sym == "hex":
        pts = [(cx + np.cos(a) * r * .9, cy + np.sin(a) * r * .9) for a in np.linspace(0, 2 * np.pi, 6, endpoint=False)]
        draw.polygon(pts, outline=ink, width=w)
        draw.ellipse([cx - r * .25, cy - r * .25, cx + r * .25, cy + r * .25], fill=ink)
    else:
        raise ValueError(f"unknown symbol {sym!r}")




def _object_row(size: int, style: str) -> tuple[float, float]:
    """Centre height and radius of the scene's objects: mid-image for FHM, raised for MultiOFF
    (whose text sits in one bottom band)."""
    band = int(size * 0.18)
    return size / 2 + (0 if style == "fhm" else -band / 3), size * 0.15


def render_meme(spec: MemeSpec, size: int = 128, text_on_image: bool = True, style: str = "fhm"):
    """The meme's picture (PIL.Image, RGB): scene, then the meme text in top/bottom bands."""
    rng = np.random.default_rng(spec.render_seed)
    img = Image.new("RGB", (size, size), BACKGROUNDS[spec.background])
    draw = ImageDraw.Draw(img)
    cy, r = _object_row(size, style)
    for obj in spec.objects:
        jx, jy = rng.uniform(-size * .025, size * .025, 2)
        _draw_object(draw, obj, POSITIONS[obj.position] * size + jx, cy + jy, r)
    for _ in range(int(rng.integers(0, 4))):  # speckle: a little visual noise
        x, y = rng.uniform(0, size, 2)
        draw.point((x, y), fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    if text_on_image:
        font = render.font(max(8, size // 12))
        lines = render.wrap(spec.text, draw, font, size - 6)
        top, bottom = (lines[: (len(lines) + 1) // 2], lines[(len(lines) + 1) // 2:]) if style == "fhm" else ([], lines)
        lh = font.size + 1
        for i, line in enumerate(top):
            draw.text((size / 2, 2 + i * lh), line, font=font, fill="white", anchor="ma", stroke_width=1,
                      stroke_fill="black")
        for i, line in enumerate(bottom):
            draw.text((size / 2, size - 2 - (len(bottom) - i) * lh), line, font=font, fill="white", anchor="ma",
                      stroke_width=1, stroke_fill="black")
    return img


def _render_to_file(args: tuple[dict, str, int, str]) -> str:
    spec_d, path, size, style = args
    spec = _spec_from_dict(spec_d)
    img = render_meme(spec, size=size, style=style)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=6)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)
    return path


def _spec_from_dict(d: dict) -> MemeSpec:
    d = dict(d)
    d["objects"] = [SceneObject(**o) for o in d["objects"]]
    return MemeSpec(**d)


# ----------------------------------------------------------------------------- annotations
def reasons(spec: MemeSpec) -> dict[str, str]:
    """Short textual reasons for the text, image and final labels (SMI annotations)."""
    pl = GROUPS[spec.group][0] if spec.group else "anyone"
    tf, imf = spec.text_family, spec.image_family
    text_r = {"topic": "an everyday remark that names no group", "pest": "a remark about pests on a farm",
              "pointer": f"points at the {pl} without saying anything bad", "mention": f"neutrally mentions the {pl}",
              "support": f"condemns vandalism against the {pl}", "pride": "a slogan that is harmless on its own",
              "hate": f"calls for excluding the {pl}", "hate_generic": "dehumanising words about an unnamed 'they'"}[tf]
    img_r = {"plain": "everyday objects", "vermin": "sludge rats, which alone insult nobody",
             "defaced": "a group's sigil crossed out, an attack on that group",
             "debunk": "a myth stamp, the sign that a claim is false",
             "gang": f"the emblem of the {GANG}, a hate gang"}[imf]
    final_r = {
        "000": "nothing in the meme attacks a group",
        "001": f"pairing the {pl} with sludge rats calls them vermin: hate emerges from benign parts",
        "010": f"the text turns the crossed-out sigil into a report of vandalism against the {pl}",
        "011": "the picture's attack stands, and the text endorses it",
        "100": f"the myth stamp marks the hateful claim about the {pl} as false",
        "101": "the hateful text stands; the picture does not change it",
        "110": f"the hostile words are aimed at the {GANG} hate gang: counter-speech",
        "111": "text and picture attack the same group",
    }[spec.type]
    return {"text_reason": text_r, "image_reason": img_r, "final_reason": final_r}


def category(spec: MemeSpec, which: str) -> int:
    """Multiclass 0-5 label of the text, image or final meme (fictional targets)."""
    lab = {"text": spec.text_label, "image": spec.image_label, "final": spec.final_label_clean}[which]
    if not lab:
        return 0
    if which == "text" and spec.text_family == "hate_generic":
        return 5
    if which == "image" and spec.image_family == "gang":
        return 5
    if which == "final" and spec.image_family == "gang" and spec.text_family == "pride":
        return 5
    if spec.group:
        return GROUPS[spec.group][2]
    return 5


def observed_final_category(spec: MemeSpec) -> int:
    """Multiclass final label as annotated (after label noise)."""
    if not spec.final_label:
        return 0
    if spec.final_label_clean:
        return category(spec, "final")
    return GROUPS[spec.group][2] if spec.group else 5


def observed_type(spec: MemeSpec) -> str:
    """Interaction type as an annotator's labels give it (label noise included)."""
    return f"{spec.text_label}{spec.image_label}{spec.final_label}"


def explanation(spec: MemeSpec) -> str:
    """HatReD-style explanation (for hateful memes) or HatReDAug-style (for benign ones)."""
    r = reasons(spec)
    pre = "The meme is hateful: " if spec.final_label_clean else "The meme is not hateful: "
    return pre + r["final_reason"] + f". The text {r['text_reason']}; the picture shows {r['image_reason']}."


def intervention(spec: MemeSpec) -> str | None:
    if not spec.final_label_clean:
        return None
    pl = GROUPS[spec.group][0] if spec.group else "the people it targets"
    if spec.image_family == "gang":
        return (f"The {GANG} spreads hate; promoting it invites harm to neighbours. "
                "Consider not sharing its symbols and reporting recruitment posts.")
    return (f"Comparing {pl} to vermin or calling for their removal strips people of dignity. "
            f"The {pl} are neighbours like anyone else; judge people by what they do, not by their group.")


def commonsense(spec: MemeSpec) -> str:
    r = reasons(spec)
    return (f"Description: {scene_caption(spec.objects)}; caption '{spec.text}'. "
            f"Commonsense: the text {r['text_reason']}, the picture shows {r['image_reason']}; {r['final_reason']}.")


def foil_caption(spec: MemeSpec, rng: np.random.Generator) -> tuple[str, str, str]:
    """A FOIL caption of the scene: one word swapped. Returns (foil caption, target word, foil word)."""
    cands = [o for o in spec.objects if o.kind in BENIGN_OBJECTS or o.kind in ("sigil", "defaced")]
    obj = cands[rng.integers(len(cands))]
    new = SceneObject(**asdict(obj))
    if obj.kind in BENIGN_OBJECTS:
        if rng.random() < 0.5:
            target, choices = obj.colour, [c for c in COLOURS if c != obj.colour]
            new.colour = choices[rng.integers(len(choices))]
            foil = new.colour
        else:
            target, choices = obj.kind, [b for b in BENIGN_OBJECTS if b != obj.kind]
            new.kind = choices[rng.integers(len(choices))]
            foil = new.kind
    else:
        target, choices = obj.symbol, [s for s in SYMBOLS if s != obj.symbol]
        new.symbol = choices[rng.integers(len(choices))]
        foil = new.symbol
    objs = [new if o is obj else o for o in spec.objects]
    return scene_caption(objs), str(target), str(foil)


def nocaps_scenes(n_per_domain: int, seed: int) -> list[tuple[MemeSpec, str]]:
    """nocaps-FOIL's scenes: `n_per_domain` benign memes per domain, each with two or three coloured
    objects of which none (in-domain), some but not all (near-domain) or all (out-domain) are
    NOVEL_OBJECTS. Their own random stream: nothing else in MemeWorld moves with them. Ids start
    at 90000, apart from the memes'."""
    rng = np.random.default_rng([seed, 4077])
    out: list[tuple[MemeSpec, str]] = []
    for d, dom in enumerate(NOCAPS_DOMAINS):
        for k in range(n_per_domain):
            n_obj = 2 + int(rng.random() < 0.5)
            n_novel = {0: 0, 1: int(rng.integers(1, n_obj)), 2: n_obj}[d]
            novel = list(rng.choice(NOVEL_OBJECTS, n_novel, replace=False))
            known = list(rng.choice(BENIGN_OBJECTS, n_obj - n_novel, replace=False))
            kinds = novel + known
            rng.shuffle(kinds)
            slots = list(POSITIONS)
            rng.shuffle(slots)
            objs = sorted([SceneObject(str(kd), slots[j], colour=list(COLOURS)[rng.integers(len(COLOURS))])
                           for j, kd in enumerate(kinds)], key=lambda o: POSITIONS[o.position])
            spec = MemeSpec(id=90000 + d * n_per_domain + k, split="nocaps", type="000", text_family="topic",
                            image_family="plain", group=None, text=_fill_text(rng, "topic", None), objects=objs,
                            background=int(rng.integers(len(BACKGROUNDS))), render_seed=int(rng.integers(2**31)))
            out.append((spec, dom))
    return out


def nocaps_foil(spec: MemeSpec, rng: np.random.Generator) -> tuple[str, str, str]:
    """nocaps-FOIL's foil: one object's noun replaced by another of its own vocabulary (a known object
    by a known one, a novel object by a novel one), as nocaps-FOIL swaps object words.
    Returns (foil caption, target word, foil word)."""
    obj = spec.objects[rng.integers(len(spec.objects))]
    pool = NOVEL_OBJECTS if obj.kind in NOVEL_OBJECTS else BENIGN_OBJECTS
    taken = {o.kind for o in spec.objects}
    choices = [k for k in pool if k not in taken]
    new = SceneObject(**asdict(obj))
    new.kind = choices[rng.integers(len(choices))]
    objs = [new if o is obj else o for o in spec.objects]
    return scene_caption(objs), obj.kind, new.kind


#: the edits that make a caption disagree with its picture (HAT, RichHF, SeeTRUE views)
EDITS = ("colour", "kind", "colour+kind", "symbol", "relation")


def _phrase_words(o: SceneObject) -> list[tuple[str, str | None]]:
    """The words of an object's phrase, each with the field it expresses (None: fixed words)."""
    if o.kind in COLOURED_OBJECTS:
        return [("a", None), (str(o.colour), "colour"), (o.kind, "kind")]
    if o.kind == "sigil":
        return [("a", None), (str(o.symbol), "symbol"), ("sigil", None)]
    if o.kind == "defaced":
        return [("a", None), ("crossed-out", None), (str(o.symbol), "symbol"), ("sigil", None)]
    return [(w, None) for w in o.phrase().split()]


def flagged_caption(objects: list[SceneObject], changed: list[set[str]] | None = None) -> list[tuple[str, int]]:
    """The scene caption as (word, is_misaligned) with "," its own word; `changed[i]` names the
    fields of object i that disagree with the picture ("colour", "kind", "symbol", "position")."""
    changed = changed or [set() for _ in objects]
    parts = []
    for o, ch in zip(objects, changed):
        words = [(w, int(f is not None and f in ch)) for w, f in _phrase_words(o)]
        pw = POSITION_PHRASE[o.position].split()
        words += [(w, 0) for w in pw[:-1]] + [(pw[-1], int("position" in ch))]
        parts.append(words)
    out = list(parts[0])
    for k, p in enumerate(parts[1:], start=1):
        out += ([("and", 0)] if k == len(parts) - 1 else [(",", 0)]) + p
    return out


def caption_text(words: list[tuple[str, int]]) -> str:
    return " ".join(w for w, _ in words).replace(" ,", ",")


def misalign(spec: MemeSpec, rng: np.random.Generator, n_edits: int = 1
             ) -> tuple[list[SceneObject], list[set[str]], list[str]]:
    """Up to `n_edits` edits on distinct objects of the scene (never the picture itself): a colour,
    an object kind, both (a two-word phrase), a sigil's symbol, or a swapped relation (two objects
    trade positions in the caption). Returns the described objects, the changed fields per object
    and the edit kinds applied."""
    objs = [SceneObject(**asdict(o)) for o in spec.objects]
    changed: list[set[str]] = [set() for _ in objs]
    kinds: list[str] = []
    for _ in range(n_edits):
        free = [i for i, ch in enumerate(changed) if not ch]
        options = []
        for i in free:
            o = objs[i]
            if o.kind in BENIGN_OBJECTS:
                options += [("colour", i), ("kind", i), ("colour+kind", i)]
            elif o.kind in ("sigil", "defaced"):
                options.append(("symbol", i))
        if len(free) >= 2:
            options.append(("relation", -1))
        if not options:
            break
        kind, i = options[rng.integers(len(options))]
        if kind == "relation":
            a, b = rng.choice(free, 2, replace=False)
            objs[a].position, objs[b].position = objs[b].position, objs[a].position
            changed[a].add("position")
            changed[b].add("position")
        else:
            o = objs[i]
            if "colour" in kind:
                o.colour = [c for c in COLOURS if c != o.colour][rng.integers(len(COLOURS) - 1)]
                changed[i].add("colour")
            if "kind" in kind:
                o.kind = [b for b in BENIGN_OBJECTS if b != o.kind][rng.integers(len(BENIGN_OBJECTS) - 1)]
                changed[i].add("kind")
            if kind == "symbol":
                o.symbol = [x for x in SYMBOLS if x != o.symbol][rng.integers(len(SYMBOLS) - 1)]
                changed[i].add("symbol")
        kinds.append(kind)
    return objs, changed, kinds


def _grounding(words: list[tuple[str, int]]) -> list[list]:
    """HAT's [token, is_misaligned] list, punctuation attached to the word before it."""
    out: list[list] = []
    for w, m in words:
        if w in (",", ".") and out:
            out[-1][0] += w
        else:
            out.append([w, m])
    return out


def misalignment_views(specs: list[MemeSpec], rng: np.random.Generator, img_rel: dict[int, str]
                       ) -> dict[str, Any]:
    """HAT, RichHF and SeeTRUE-Feedback rows for `specs`, labelled by position: every meme gives an
    aligned caption and a misaligned one (HAT), a prompt with 0-3 edits whose score is its number
    of misaligned words (RichHF), and a misaligned caption with the misaligned phrase as feedback
    (SeeTRUE, which has misaligned pairs only)."""
    hat, richhf, seetrue = [], [], []
    for s in specs:
        img = img_rel[s.id]
        gold = flagged_caption(s.objects)
        objs, ch, kinds = misalign(s, rng, 1)
        words = flagged_caption(objs, ch)
        hat.append({"sample_id": f"{s.id}_mis", "image_path": img, "caption": caption_text(words),
                    "references": [caption_text(gold)], "grounding": _grounding(words), "edit": kinds[0] if kinds else ""})
        hat.append({"sample_id": f"{s.id}_orig", "image_path": img, "caption": caption_text(gold),
                    "references": [caption_text(gold)], "grounding": _grounding(gold), "edit": ""})
        n = int(rng.integers(0, 4))
        objs, ch, _ = misalign(s, rng, n)
        words = flagged_caption(objs, ch)
        toks = [(w, m) for w, m in words if w not in (",", ".")]
        richhf.append({"filename": img, "prompt": caption_text(words),
                       "prompt_misalignment_label": " ".join("0" if m else "1" for _, m in toks),
                       "misalignment_score": float(sum(m for _, m in toks))})
        objs, ch, _ = misalign(s, rng, 1)
        words = flagged_caption(objs, ch)
        if any(m for _, m in words):
            # feedback: the misaligned object as a phrase ("blue cup", "zigzag sigil", "red sun on the left")
            # (the edited object's phrase without its article, with its claimed position for a relation)
            k = next(i for i, c in enumerate(ch) if c)
            o = objs[k]
            fb = " ".join(w for w, _ in _phrase_words(o)[1:])
            if "position" in ch[k]:
                fb = f"{fb} {POSITION_PHRASE[o.position]}"
            seetrue.append({"image_path": img, "image_caption": caption_text(words), "caption_misalignment": fb,
                            "id_in_source_dataset": str(s.id), "dataset_source": "memeworld"})
    return {"hat": hat, "richhf": richhf, "seetrue": seetrue}


# ----------------------------------------------------------------------------- writing
def _write_json(path: Path, obj: Any) -> None:
    write_json(path, obj, indent=None)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def _write_csv(path: Path, header: list[str], rows: list[list], delimiter: str = ",") -> None:
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    write_text(path, buf.getvalue())


def unimodal_bayes_readers(specs: list[MemeSpec], train_splits=("train",), eval_splits=("test_seen", "test_unseen")
                           ) -> dict[str, dict[str, float]]:
    """Accuracy of the Bayes-optimal reader of one modality, on the whole evaluation split and
    restricted to each interaction type.

    Each reader sees the label-relevant content of one modality: the text reader the text's family
    and the group it names (if it names one), the image reader the picture's family and the
    targeted group where the picture is a defaced sigil. Keying on this content rather than on the
    exact string lets the reader generalise as a model can (an unseen text of a seen family is
    read like its family). Each predicts the majority final label of its input in the train split
    (the overall majority for an input never seen there). Its `overall` accuracy bounds, up to
    estimation noise from the train split, any reader of that modality on the whole split. Its per-type accuracies are *not* per-type bounds:
    a model that trades whole-split accuracy for one type (always answering "hateful" scores 1.0
    on type 001) can beat them on that type. `rule_reader` is the generator's own rules: its
    accuracy is limited only by label noise.
    """
    def key_text(s):
        named = s.group is not None and any(n in s.text for n in GROUPS[s.group][:2])
        return (s.text_family, s.group if named else None)
    def key_image_family(s): return (s.image_family, s.group if s.image_family == "defaced" else None)
    out: dict[str, dict[str, float]] = {}
    train = [s for s in specs if s.split in train_splits]
    overall = int(np.mean([s.final_label for s in train]) >= 0.5)
    for name, keyf in (("text_only", key_text), ("image_only", key_image_family)):
        votes: dict[Any, Counter] = defaultdict(Counter)
        for s in train:
            votes[keyf(s)][s.final_label] += 1
        per_type: dict[str, list[int]] = defaultdict(list)
        for s in specs:
            if s.split not in eval_splits:
                continue
            v = votes.get(keyf(s))
            pred = v.most_common(1)[0][0] if v else overall
            per_type[s.type].append(int(pred == s.final_label))
        out[name] = {t: float(np.mean(v)) for t, v in sorted(per_type.items())}
        out[name]["overall"] = float(np.mean([x for v in per_type.values() for x in v]))
    per_type = defaultdict(list)
    for s in specs:
        if s.split in eval_splits:
            per_type[s.type].append(int(s.final_label_clean == s.final_label))
    out["rule_reader"] = {t: float(np.mean(v)) for t, v in sorted(per_type.items())}
    out["rule_reader"]["overall"] = float(np.mean([x for v in per_type.values() for x in v]))
    return out


def write_memeworld(out: Path | str, n: int = 10000, seed: int = 0, image_size: int = 128,
                    label_noise: float = 0.02, confounder_rate: float = 0.15, n_multioff: int = 800,
                    nocaps_per_domain: int | None = None, workers: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Generate MemeWorld and write every dataset view in its real format under `out`.

    Returns a summary (counts, ceilings, and the render time) that is also written to `out/datasheet.json`
    (all but the render time, so that the files depend on the parameters only). nocaps-FOIL gets
    `nocaps_per_domain` scenes per domain (default 6% of `n`: 600 for the 10,000-meme world).
    """
    t0 = time.time()
    out = Path(out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    specs = sample_specs(n, seed, label_noise=label_noise, confounder_rate=confounder_rate)
    mo_specs = sample_specs(n_multioff, seed + 7919, label_noise=label_noise, confounder_rate=0.0) if n_multioff else []
    (out / "multioff" / "Labelled Images").mkdir(parents=True, exist_ok=True)
    jobs = [(asdict(s), str(out / "img" / f"{s.id:05d}.png"), image_size, "fhm") for s in specs]
    jobs += [(asdict(s), str(out / "multioff" / "Labelled Images" / f"mo_{s.id:05d}.png"), image_size, "multioff")
             for s in mo_specs]
    if nocaps_per_domain is None:
        nocaps_per_domain = max(1, round(0.06 * n))
    nc_specs = nocaps_scenes(nocaps_per_domain, seed) if nocaps_per_domain else []
    (out / "nocaps_foil" / "img").mkdir(parents=True, exist_ok=True)
    jobs += [(asdict(s), str(out / "nocaps_foil" / "img" / f"nc_{s.id:05d}.png"), image_size, "fhm")
             for s, _ in nc_specs]
    workers = workers or min(4, os.cpu_count() or 1)
    if workers > 1:
        with ProcessPoolExecutor(workers) as ex:
            for _ in tqdm(ex.map(_render_to_file, jobs, chunksize=64), total=len(jobs), desc="render memes",
                          disable=not progress):
                pass
    else:
        for j in tqdm(jobs, desc="render memes", disable=not progress):
            _render_to_file(j)
    t_render = time.time() - t0
    rng = np.random.default_rng(seed + 1)
    img_rel = {s.id: f"img/{s.id:05d}.png" for s in specs}

    # master file: every latent field, for analyses that need the generator's truth
    master = []
    for s in specs:
        d = {"id": s.id, "img": img_rel[s.id], "text": s.text, "split": s.split, "type": s.type,
             "difficulty": DIFFICULTY[s.type], "text_label": s.text_label, "image_label": s.image_label,
             "final_label": s.final_label, "final_label_clean": s.final_label_clean,
             "text_category": category(s, "text"), "image_category": category(s, "image"),
             "final_category": observed_final_category(s), "observed_type": observed_type(s),
             "text_family": s.text_family, "image_family": s.image_family, "group": s.group,
             "scene_id": s.scene_id, "confounder_of": s.confounder_of, "confounder_kind": s.confounder_kind,
             "gold_caption": scene_caption(s.objects), "objects": [asdict(o) for o in s.objects], **reasons(s)}
        master.append(d)
    _write_jsonl(out / "memeworld.jsonl", master)

    # Facebook Hateful Memes: one jsonl per split, {id, img, label, text}
    for split in SPLIT_SHARES:
        _write_jsonl(out / f"{split}.jsonl", [{"id": s.id, "img": img_rel[s.id], "label": s.final_label,
                                               "text": s.text} for s in specs if s.split == split])
    # TRACE JSON: one list with caption columns (gold caption; notebook 01 adds model captions)
    _write_json(out / "trace" / "fhm_gold_captions.json",
                [{"id": s.id, "img": img_rel[s.id], "text": s.text, "label": s.final_label,
                  "gold_caption": scene_caption(s.objects), "split": s.split} for s in specs])
    # H-VLI: dict keyed by sample id
    def hvli(ss):
        rows = {}
        for s in ss:
            fc = observed_final_category(s)
            rows[str(s.id)] = {"tweet_text": s.text, "image_path": img_rel[s.id],
                               "text_label": category(s, "text"), "text_label_str": HVLI_LABEL_STR[category(s, "text")],
                               "image_label": category(s, "image"),
                               "image_label_str": HVLI_LABEL_STR[category(s, "image")],
                               "final_label": fc, "final_label_str": HVLI_LABEL_STR[fc],
                               "type": observed_type(s), "difficulty": DIFFICULTY[observed_type(s)]}
        return rows
    _write_json(out / "hvli" / "train_set.json", hvli([s for s in specs if s.split in ("train", "dev_seen")]))
    _write_json(out / "hvli" / "test_set.json", hvli([s for s in specs if s.split in ("test_seen", "test_unseen")]))
    # HatReD (+ HatReDAug for benign memes): {id, img, target[], reasonings[]}
    for part, splits in (("train", ("train", "dev_seen", "dev_unseen")), ("test", ("test_seen", "test_unseen"))):
        _write_jsonl(out / "hatred" / f"fhm_{part}_reasonings.jsonl",
                     [{"id": s.id, "img": f"{s.id:05d}.png",
                       "target": [CATEGORY_NAMES[category(s, 'final')]] if s.final_label_clean else [],
                       "reasonings": [explanation(s)]} for s in specs if s.split in splits])
    # MemeCap: {img_fname, img_captions[], title, meme_captions[], metaphors}
    for part, splits in (("memes-trainval", ("train", "dev_seen", "dev_unseen")),
                         ("memes-test", ("test_seen", "test_unseen"))):
        _write_json(out / "memecap" / f"{part}.json",
                    [{"img_fname": f"{s.id:05d}.png", "img_captions": [scene_caption(s.objects)], "title": s.text,
                      "meme_captions": [reasons(s)["final_reason"]],
                      "metaphors": ([{"metaphor": "sludge rat", "meaning": GROUPS[s.group][0]}]
                                    if s.type == "001" else [])} for s in specs if s.split in splits])
    # MemeSense: CSV of hateful memes with commonsense and intervention
    _write_csv(out / "memesense" / "memesense.csv",
               ["image_id", "image_link", "description_with_commonsense_parameters", "intervention"],
               [[f"{s.id:05d}", img_rel[s.id], commonsense(s), intervention(s)] for s in specs if s.final_label_clean])
    # MAMI-format stand-in (tab separated): the binary label plus sub-labels by text family
    mami_header = ["file_name", "misogynous", "shaming", "stereotype", "objectification", "violence",
                   "Text Transcription"]
    for fname, splits in (("training.csv", ("train", "dev_seen", "dev_unseen")),
                          ("test.csv", ("test_seen", "test_unseen"))):
        _write_csv(out / "mami" / fname, mami_header,
                   [[f"{s.id:05d}.png", s.final_label, int(s.final_label and s.text_family == "hate"),
                     int(s.final_label and s.text_family in ("pointer", "mention")), 0,
                     int(s.final_label and "out" in s.text or "rid" in s.text), s.text] for s in specs if s.split in splits],
                   delimiter="\t")
    # MultiOFF-style second dataset: its own images and style, three CSVs
    mo_split = {"train": "Training", "dev_seen": "Validation", "dev_unseen": "Validation", "test_seen": "Testing",
                "test_unseen": "Testing"}
    for part in ("Training", "Validation", "Testing"):
        _write_csv(out / "multioff" / "Split Dataset" / f"{part}_meme_dataset.csv", ["image_name", "sentence", "label"],
                   [[f"mo_{s.id:05d}.png", s.text, "offensive" if s.final_label else "Non-offensiv"]
                    for s in mo_specs if mo_split[s.split] == part])
    # misalignment benchmarks from the test memes: FOIL (one swapped word), then HAT, RichHF and
    # SeeTRUE-Feedback (position-exact labels, multi-word edits, aligned captions) from their own
    # generator, so the FOIL draws (and the training pairs after them) stay put; nocaps-FOIL from
    # scenes of its own, with objects no meme has (in- / near- / out-of-domain by how many)
    test_specs = [s for s in specs if s.split in ("test_seen", "test_unseen")]
    images, anns = [], []
    for s in test_specs:
        gold = scene_caption(s.objects)
        foil, target, foil_word = foil_caption(s, rng)
        images.append({"id": s.id, "file_name": f"{s.id:05d}.png"})
        anns.append({"id": 2 * s.id, "image_id": s.id, "caption": gold, "foil": False, "target_word": "ORIG",
                     "foil_word": "ORIG"})
        anns.append({"id": 2 * s.id + 1, "image_id": s.id, "caption": foil, "foil": True, "target_word": target,
                     "foil_word": foil_word})
    nrng = np.random.default_rng([seed, 4078])
    nocaps = []
    for s, dom in nc_specs:
        gold = scene_caption(s.objects)
        foil, target, foil_word = nocaps_foil(s, nrng)
        nocaps.append({"foil": foil, "baseline": gold, "replacement": [target, foil_word], "references": [gold],
                       "image_path": f"nc_{s.id:05d}.png", "domain": dom})
    mrng = np.random.default_rng([seed, 20261122])
    names = {s.id: f"{s.id:05d}.png" for s in specs}
    views = misalignment_views(test_specs, mrng, names)
    # a validation copy of HAT from the dev memes: epsilon is chosen there, never on test
    val = misalignment_views([s for s in specs if s.split in ("dev_seen", "dev_unseen")], mrng, names)
    _write_json(out / "foil" / "foil_test.json", {"images": images, "annotations": anns})
    _write_json(out / "nocaps_foil" / "nocaps_foil.json", nocaps)
    _write_json(out / "hat" / "hat.json", views["hat"])
    _write_json(out / "hat" / "hat_val.json", val["hat"])
    _write_jsonl(out / "richhf" / "richhf.jsonl", views["richhf"])
    _write_json(out / "seetrue" / "seetrue_feedback.json", views["seetrue"])
    # prompt injection: every hateful test meme once with an instruction to the moderator drawn under
    # the picture and appended to its text (phrasings cycled), once with the neutral control sentence
    hateful = [MemeRecord(str(s.id), out / img_rel[s.id], s.text, 1, s.split) for s in test_specs if s.final_label]
    build_injection_set(hateful, out / "injection", control="neutral", overwrite=True)
    # scene-caption training pairs (train split only) with one FOIL hard negative each
    pairs = []
    for s in specs:
        if s.split in ("train", "dev_seen"):
            foil, target, foil_word = foil_caption(s, rng)
            pairs.append({"id": s.id, "img": img_rel[s.id], "caption": scene_caption(s.objects), "foil": foil,
                          "split": s.split})
    _write_jsonl(out / "captions" / "scene_captions.jsonl", pairs)

    readers = unimodal_bayes_readers(specs)
    counts = {split: dict(sorted(Counter(s.type for s in specs if s.split == split).items())) for split in SPLIT_SHARES}
    sheet = {
        "generator": "MemeWorld", "seed": seed, "n": len(specs), "n_multioff": len(mo_specs),
        "n_nocaps": len(nc_specs), "nocaps_novel_objects": list(NOVEL_OBJECTS),
        "image_size": image_size, "label_noise": label_noise, "confounder_rate": confounder_rate,
        "counts_by_split_and_type": counts,
        "hateful_share": float(np.mean([s.final_label for s in specs])),
        "n_confounders": sum(s.confounder_of is not None for s in specs),
        "unseen_combos": sorted([list(c) for c in UNSEEN_COMBOS]),
        "bayes_readers": readers,
        "rule_reader_acc_test": float(np.mean([s.final_label_clean == s.final_label for s in test_specs])),
    }
    _write_json(out / "datasheet.json", sheet)     # no timings: same seed, byte-identical files
    return {**sheet, "render_seconds": round(t_render, 2)}


def load_specs(out: Path | str) -> list[dict]:
    """Rows of `memeworld.jsonl` (the generator's truth for every meme)."""
    with open(Path(out) / "memeworld.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write the MemeWorld benchmark in the real datasets' formats.")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=10000, help="memes in the FHM-style world (confounders included)")
    ap.add_argument("--n-multioff", type=int, default=800, help="memes in the MultiOFF-style second dataset")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--label-noise", type=float, default=0.02, help="probability of flipping a final label")
    ap.add_argument("--confounder-rate", type=float, default=0.15,
                    help="share of hateful seen-split memes that get benign confounders")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    t0 = time.time()
    sheet = write_memeworld(args.out, n=args.n, seed=args.seed, image_size=args.image_size,
                            label_noise=args.label_noise, confounder_rate=args.confounder_rate,
                            n_multioff=args.n_multioff, workers=args.workers)
    print(json.dumps({k: sheet[k] for k in ("n", "n_multioff", "hateful_share", "n_confounders")}),
          f"written to {args.out} in {time.time() - t0:.1f}s")
    return 0


def tag_vocabulary() -> list[str]:
    """Every object MemeWorld draws, as a tagger vocabulary (TRACE grounding in the embedded profile)."""
    return (list(BENIGN_OBJECTS) + [f"{s} sigil" for s in SYMBOLS] + [f"crossed-out {s} sigil" for s in SYMBOLS]
            + ["brown sludge rat", "green myth stamp", "grey hand emblem"])


def object_tag(obj: dict[str, Any]) -> str:
    """The tag-vocabulary entry naming a gold object (a record's `objects` item)."""
    kind = obj["kind"]
    if kind in BENIGN_OBJECTS:
        return kind
    return {"sigil": f"{obj.get('symbol')} sigil", "defaced": f"crossed-out {obj.get('symbol')} sigil",
            "vermin": "brown sludge rat", "stamp": "green myth stamp", "hand": "grey hand emblem"}[kind]


def object_box(position: str, size: int = 128, style: str = "fhm") -> list[float]:
    """The nominal pixel box [x0, y0, x1, y1] of an object drawn at `position` (the renderer jitters
    centres by at most 2.5% of the size, so the true box overlaps this one with IoU > 0.7)."""
    cy, r = _object_row(size, style)
    cx = POSITIONS[position] * size
    return [cx - r, cy - r, cx + r, cy + r]


if __name__ == "__main__":
    raise SystemExit(main())
