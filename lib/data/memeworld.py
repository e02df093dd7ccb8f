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

Command: `python -m lib.data.memeworld_files --out DIR --seed S --n N`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.compendium.artifacts import read_jsonl


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


def load_specs(out: Path | str) -> list[dict]:
    """Rows of `memeworld.jsonl` (the generator's truth for every meme)."""
    return read_jsonl(Path(out) / "memeworld.jsonl")


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
