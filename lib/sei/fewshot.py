"""See, Explain, Intervene (§5.2-5.3): exemplar retrieval, few-shot prompts, parsing and scoring.

No official code exists; every choice the paper leaves open is a parameter here, with the
default `../shared/reference/see-explain-intervene.md` proposes:

- retrieval: exact top-n train memes by image-embedding cosine, ties to the earlier train meme,
  most similar exemplar last (closest to the query) or first (`order`);
- the prompt: a system prompt with the two definitions, one user turn (image, caption, OCR text
  in three backticks) and one assistant turn (gold label, explanation, intervention only for
  hateful exemplars) per exemplar, then the test meme; all wording in template files under
  `params/prompts/sei/` that a profile can swap for another wording;
- parsing: the leading label before the first dash (`non-hateful` checked before `hateful`), the
  explanation up to an `Intervention` marker or the next ` - `, the intervention after it (kept
  only for hateful answers); statuses ok, unparseable, refused, blocked, failed; truncated
  answers kept and flagged; or structured output (a JSON schema) where the backend supports it;
- controls: zero-shot (n = 0), random exemplars, retrieved exemplars whose labels are redrawn at
  random (each with the label-aware explainer's explanation for the new label, so only the
  label-to-meme link is broken), and the exemplars' majority label with no model at all.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml

from lib import ROOT
from lib.models.chat import GenParams, assistant, image, system, text, user
from lib.models.chat.structured import ambiguity, cap_string_lengths
from lib.evaluation.metrics import classification_report
from lib.evaluation.textmetrics import score_texts

LABELS = ("non-hateful", "hateful")
STATUSES = ("ok", "unparseable", "refused", "blocked", "failed")
ORDERS = ("most_similar_last", "most_similar_first")
#: same_type: the oracle retriever, the retriever's nearest memes of the query's own interaction type (MemeWorld
#: knows each meme's type): the positive control of the retrieval claims, informative neighbours by construction
EXEMPLAR_KINDS = ("retrieved", "random", "shuffled_labels", "same_type")
SCHEMA_FILE = ROOT / "params" / "schemas" / "sei_answer.json"


# ----------------------------------------------------------------------------- memes in prompts
@dataclass
class Meme:
    """A meme as the few-shot prompt sees it."""
    id: str
    img_path: Path
    ocr: str
    label: int | None = None
    caption: str = ""
    explanation: str = ""
    intervention: str = ""
    split: str = ""
    type: str | None = None          # SMI interaction type where the dataset has one (MemeWorld)


def order_exemplars(ranked: Sequence[Any], order: str) -> list[Any]:
    """Ranked most similar first -> prompt order."""
    if order not in ORDERS:
        raise ValueError(f"exemplar order must be one of {ORDERS}, got {order!r}")
    return list(ranked)[::-1] if order == "most_similar_last" else list(ranked)


# ----------------------------------------------------------------------------- prompt
@dataclass(frozen=True)
class SeiTemplates:
    """The prompt's wording: `system.txt` ({hateful_definition}, {non_hateful_definition}),
    `user.txt` ({caption}, {ocr}), `answer.txt` ({label}, {explanation}, {intervention}: the
    rendered `intervention.txt`, or nothing) and `definitions.yaml` (named sets of the two
    definitions, e.g. fhm and mami)."""
    system: str
    user: str
    answer_text: str
    intervention_text: str
    definitions: dict[str, dict[str, str]]
    source: str = ""

    @classmethod
    def load(cls, prompt_dir: str | Path = "params/prompts/sei") -> "SeiTemplates":
        d = Path(prompt_dir)
        d = d if d.is_absolute() else ROOT / d

        def read(name: str) -> str:
            p = d / name
            if not p.exists():
                raise FileNotFoundError(f"SEI prompt template {p} does not exist")
            return p.read_text(encoding="utf-8").strip("\n")
        defs_file = d / "definitions.yaml"
        if not defs_file.exists():
            raise FileNotFoundError(f"SEI definitions {defs_file} do not exist")
        defs = yaml.safe_load(defs_file.read_text(encoding="utf-8")) or {}
        for name, dd in defs.items():
            if not isinstance(dd, dict) or set(dd) != {"hateful", "non_hateful"}:
                raise ValueError(f"{defs_file}: definition set '{name}' must hold exactly 'hateful' and "
                                 f"'non_hateful'")
        return cls(read("system.txt"), read("user.txt"), read("answer.txt"), read("intervention.txt"), defs, str(d))

    def system_prompt(self, definitions: str) -> str:
        if definitions not in self.definitions:
            raise KeyError(f"no definition set '{definitions}' in {self.source}/definitions.yaml "
                           f"(have: {sorted(self.definitions)})")
        dd = self.definitions[definitions]
        return self.system.format(hateful_definition=" ".join(dd["hateful"].split()),
                                  non_hateful_definition=" ".join(dd["non_hateful"].split()))

    def user_text(self, m: Meme) -> str:
        return self.user.format(caption=(m.caption or "").strip().rstrip("."), ocr=(m.ocr or "").strip())

    def answer(self, label: int, explanation: str, intervention: str = "") -> str:
        iv = self.intervention_text.format(intervention=intervention.strip()) if label == 1 and intervention else ""
        return self.answer_text.format(label=LABELS[label], explanation=explanation.strip(), intervention=iv)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def build_conversation(query: Meme, shots: Sequence[Meme], tpl: SeiTemplates, definitions: str = "fhm",
                       images: bool = True, labels_only: bool = False) -> list[dict[str, Any]]:
    """system(definitions); per shot: user(image, caption + OCR) and assistant(label - explanation
    [- intervention]); then user(test image, caption + OCR). Shots are in prompt order. `labels_only`:
    each shot's answer is its label alone (the "Explain" ingredient removed: no explanation, no intervention)."""

    def turn(m: Meme):
        parts = ([image(str(m.img_path))] if images else []) + [text(tpl.user_text(m))]
        return user(*parts)
    msgs = [system(tpl.system_prompt(definitions))]
    for s in shots:
        if s.label not in (0, 1):
            raise ValueError(f"exemplar {s.id} has no gold label")
        msgs += [turn(s), assistant(LABELS[s.label] if labels_only else
                                    tpl.answer(s.label, s.explanation, s.intervention if s.label == 1 else ""))]
    msgs.append(turn(query))
    return msgs


# ----------------------------------------------------------------------------- parsing
@dataclass
class Answer:
    status: str                       # ok | unparseable | refused | blocked | failed
    label: int | None = None
    explanation: str = ""
    intervention: str = ""
    truncated: bool = False           # the answer hit max_new_tokens
    dropped_intervention: bool = False  # a non-hateful answer carried an intervention (dropped)
    raw: str = ""


_LABEL_AT_START = re.compile(r"^\W*(?:label|answer|classification|output|prediction)?\W*"
                             r"(non[\s\-–]?hateful|not[\s\-–]hateful|hateful)\b", re.I)
_INTERVENTION = re.compile(r"\bintervention\s*[-–:]\s*", re.I)
_SEP = re.compile(r"\s[-–]\s")
_REFUSAL = re.compile(r"\b(i\s*(?:can(?:'|no)t|cannot|am unable|won'?t|will not)\s+(?:help|assist|classify|comply|"
                      r"provide|do that|engage)|i'?m sorry|as an ai\b)", re.I)


PARSERS = ("strict", "lenient")
_LABEL_ANYWHERE = re.compile(r"\b(non[\s\-–]?hateful|not[\s\-–]hateful|hateful)\b", re.I)
#: Words that turn a following "hateful" around ("isn't hateful", "is not at all hateful", "nothing hateful").
_NEGATION = re.compile(r"\b(?:not|no|never|nothing|neither|nor|none|hardly|without|\w+n['’]t|cannot)\b", re.I)
#: A label, when the answer starts with one, is within this many characters of the start (bounding
#: the match keeps parsing linear in the answer's length however it is padded).
_LABEL_WINDOW = 400


def _lenient_label(sentence: str) -> int | None:
    """The label a first sentence states, or None when it states none or is ambiguous: each
    mention of "hateful" counts as non-hateful when a negation stands in the five words before it
    ("isn't hateful", "not at all hateful"), two negations there are ambiguous, and mentions that
    disagree are ambiguous. Never a guess."""
    labels = set()
    for hit in _LABEL_ANYWHERE.finditer(sentence):
        word = re.sub(r"[\s\-–]", "", hit.group(1).lower())
        if word in ("nonhateful", "nothateful"):
            labels.add(0)
            continue
        before = " ".join(re.findall(r"[\w'’]+", sentence[:hit.start()])[-5:])
        negations = len(_NEGATION.findall(before))
        if negations > 1:
            return None
        labels.add(0 if negations == 1 else 1)
    return labels.pop() if len(labels) == 1 else None


def parse_answer(text: str | None, chat_status: str = "ok", finish_reason: str | None = None,
                 parsed: Any = None, parser: str = "strict") -> Answer:
    """An answer's label, explanation and intervention (see the module docstring for the rules).
    `lenient` also takes a label word from the first sentence when the answer does not start with
    one ("The meme is hateful because ..."); the explanation is then the whole answer."""
    if parser not in PARSERS:
        raise ValueError(f"parser must be one of {PARSERS}, got {parser!r}")
    raw = text or ""
    truncated = finish_reason == "length"
    if chat_status in ("blocked", "failed", "refused"):
        return Answer(chat_status, raw=raw, truncated=truncated)
    if isinstance(parsed, dict):                      # structured output
        lab = str(parsed.get("label", "")).strip().lower()
        if lab not in LABELS:
            return Answer("unparseable", raw=raw, truncated=truncated)
        y = LABELS.index(lab)
        iv = str(parsed.get("intervention") or "").strip()
        return Answer("ok", y, str(parsed.get("explanation") or "").strip(), iv if y == 1 else "", truncated,
                      bool(iv) and y == 0, raw)
    if chat_status == "unparseable" or ambiguity(raw):   # a repeated key or two JSON objects: two readings
        return Answer("unparseable", raw=raw, truncated=truncated)
    s = raw.strip().replace("{", "").replace("}", "").strip()
    m = _LABEL_AT_START.match(s[:_LABEL_WINDOW])
    if not m:
        if _REFUSAL.search(s):
            return Answer("refused", raw=raw, truncated=truncated)
        first = re.split(r"(?<=[.!?])\s|\n", s, maxsplit=1)[0]
        y = _lenient_label(first) if parser == "lenient" else None
        if y is None:
            return Answer("unparseable", raw=raw, truncated=truncated)
        iv_m = _INTERVENTION.search(s)
        expl, iv = (s[:iv_m.start()], s[iv_m.end():]) if iv_m else (s, "")
        return Answer("ok", y, expl.strip(), iv.strip() if y == 1 else "", truncated, bool(iv.strip()) and y == 0, raw)
    word = re.sub(r"[\s\-–]", "", m.group(1).lower())
    y = 0 if word in ("nonhateful", "nothateful") else 1
    rest = s[m.end():].lstrip(" -–:.,")
    iv_m = _INTERVENTION.search(rest)
    if iv_m:
        expl, iv = rest[:iv_m.start()], rest[iv_m.end():]
    else:
        sep = _SEP.search(rest)
        expl, iv = (rest[:sep.start()], rest[sep.end():]) if sep else (rest, "")
    expl, iv = expl.strip().rstrip(" -–"), iv.strip()
    dropped = bool(iv) and y == 0
    return Answer("ok", y, expl, iv if y == 1 else "", truncated, dropped, raw)


def answer_schema(string_max_length: int | None = None) -> dict[str, Any]:
    """The structured answer's JSON schema; `string_max_length` caps the explanation and the
    intervention (a short-answer option: fewer tokens, and an answer that ends before max_new_tokens)."""
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return cap_string_lengths(schema, int(string_max_length)) if string_max_length else schema


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Setting:
    """One few-shot configuration: model x retriever x n, or a control."""
    name: str
    n: int
    retriever: str | None = None       # None for zero-shot and random exemplars
    exemplars: str = "retrieved"       # retrieved | random | shuffled_labels | same_type (the oracle retriever)
    structured: bool = False           # JSON-schema output (where the backend supports it)
    labels_only: bool = False          # the exemplars' answers show their label alone (no explanation or intervention)
    eval_n: int = 0                    # 0: every evaluation meme; else the named balanced subset of this size
    replicate: int = 0                 # > 0: cold run `replicate` of another setting (`<name>_run<k>`): the same
                                       #   prompts asked afresh, and random exemplars drawn anew

    def __post_init__(self):
        if self.exemplars not in EXEMPLAR_KINDS:
            raise ValueError(f"setting {self.name}: exemplars must be one of {EXEMPLAR_KINDS}, got {self.exemplars!r}")
        if self.n < 0:
            raise ValueError(f"setting {self.name}: n must be >= 0")
        if self.n and self.exemplars != "random" and not self.retriever:
            raise ValueError(f"setting {self.name}: {self.exemplars} exemplars need a retriever")
        if self.eval_n < 0:
            raise ValueError(f"setting {self.name}: eval_n must be >= 0")
        if self.replicate < 0:
            raise ValueError(f"setting {self.name}: replicate must be >= 0")


def main_setting_name(retrievers: Sequence[str], shots: Sequence[int]) -> str:
    """The setting notebook 04 reports as its main row: the first retriever with 4 shots (or the
    largest n). Its answers, one per test meme, are also what the §7 text analyses read (pooling
    the 2- and 4-shot answers would count every meme twice)."""
    return f"{retrievers[0]}/{4 if 4 in shots else shots[-1]}"


def cold_run_name(setting: str, run: int) -> str:
    """The name of cold run `run` (1, 2, ...) of a setting; run 0 is the setting itself."""
    return setting if run == 0 else f"{setting}_run{run}"


def cold_run_of(name: str) -> tuple[str, int]:
    """(setting, run) of a setting name: `<setting>_run<k>` is cold run k of `<setting>`, anything else run 0."""
    m = re.fullmatch(r"(.+)_run(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


ANSWER_FORMATS = ("free_text", "structured")


def parse_settings(spec: dict[str, dict[str, Any]], retrievers: Sequence[str], shots: Sequence[int],
                   answer_format: str = "free_text", subset: dict[str, Any] | None = None,
                   cold_runs: dict[str, Any] | None = None) -> list[Setting]:
    """Expand the profile: the retrieved grid (each retriever x each n) plus the named controls.

    `answer_format`: how every setting answers unless a control says `structured: true/false`
    (free_text: the paper's "label - explanation - intervention"; structured: a JSON object through
    the server's constrained decoding). `subset`: {"n": k, "settings": [names]}: those settings run
    on the evaluation set's balanced subset of k memes (drawn nested in the full draw), the others on
    every evaluation meme. `cold_runs`: {"runs": k, "settings": [names; "main" is the main setting][, "n": m]}:
    each named setting also runs k - 1 more times as `<name>_run1` ... (the same prompts asked
    afresh, each run's answers cached apart; random exemplars and shuffled labels drawn anew), on the
    memes the setting runs on, or with `n` on their nested balanced subset of m (a setting grown for
    its claim's power keeps its cold runs at the size the other settings run on)."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
    structured = answer_format == "structured"
    out = [Setting(f"{r}/{n}", n, r, structured=structured) for r in retrievers for n in shots]
    for name, over in (spec or {}).items():
        over = dict(over)
        unknown = set(over) - {"n", "retriever", "exemplars", "structured", "labels_only"}
        if unknown:
            raise ValueError(f"setting {name}: unknown keys {sorted(unknown)} (n, retriever, exemplars, structured, "
                             f"labels_only)")
        if over.get("retriever") == "default":
            over["retriever"] = retrievers[0]
        if cold_run_of(name)[1]:
            raise ValueError(f"setting {name}: names ending in _run<k> are cold runs (set cold_runs instead)")
        out.append(Setting(name, int(over.get("n", 0)), over.get("retriever"), over.get("exemplars", "retrieved"),
                           bool(over.get("structured", structured)), labels_only=bool(over.get("labels_only", False))))
    names = [s.name for s in out]
    dup = [n for n, c in Counter(names).items() if c > 1]
    if dup:
        raise ValueError(f"settings named twice: {dup}")
    if subset:
        extra = set(subset) - {"n", "settings"}
        if extra or "n" not in subset:
            raise ValueError(f"subset: expected keys n and settings, got {sorted(subset)}")
        k, chosen = int(subset["n"]), list(subset.get("settings") or [])
        missing = [c for c in chosen if c not in names]
        if missing:
            raise ValueError(f"subset.settings names no setting: {missing} (settings: {names})")
        if k <= 0:
            raise ValueError(f"subset.n must be > 0, got {k}")
        out = [replace(s, eval_n=k) if s.name in chosen else s for s in out]
    if cold_runs:
        extra = set(cold_runs) - {"runs", "settings", "n"}
        runs, m = cold_runs.get("runs"), cold_runs.get("n")
        if extra or isinstance(runs, bool) or not isinstance(runs, int) or runs < 1 or \
                (m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1)):
            raise ValueError(f"cold_runs: expected {{runs: k >= 1, settings: [names], n: m >= 1 (optional)}}, "
                             f"got {cold_runs!r}")
        main = main_setting_name(retrievers, shots) if retrievers and shots else None
        chosen = [main if c == "main" else c for c in (cold_runs.get("settings") or [])]
        missing = [c for c in chosen if c not in names]
        if missing:
            raise ValueError(f"cold_runs.settings names no setting: {missing} (settings: {names}, or main)")
        by_name = {s.name: s for s in out}
        def size(c):     # a cold run never runs on more memes than its setting
            return by_name[c].eval_n if m is None else min(m, by_name[c].eval_n or m)
        out += [replace(by_name[c], name=cold_run_name(c, r), replicate=r, eval_n=size(c))
                for c in chosen for r in range(1, runs)]
    return out


def setting_queries(setting: Setting, queries: Sequence[Meme], seed: int = 0, by: str = "label",
                    population: Sequence[Meme] | None = None) -> list[Meme]:
    """The evaluation memes one setting runs on: all of them, or a balanced subset of `setting.eval_n`
    (the same draw rule and seed as the evaluation set). With `population` (the test split the
    evaluation set was drawn from) the subset is drawn from it wherever that draw lies inside `queries`:
    a type-balanced draw is nested while no type runs short, so the setting answers the very memes a run
    with `eval_n` = k answers, and a grown evaluation set reuses the smaller one's answers. Where it does
    not lie inside (a type runs short, or a label-balanced draw), the subset is drawn from `queries`."""
    if not setting.eval_n:
        return list(queries)
    if population is not None:
        by_id = {q.id: q for q in queries}
        drawn = balanced_subset(population, setting.eval_n, seed, by)
        if all(m.id in by_id for m in drawn):
            return [by_id[m.id] for m in drawn]
    return balanced_subset(queries, setting.eval_n, seed, by)


def plan_exemplars(setting: Setting, queries: Sequence[Meme], pool: Sequence[Meme], ranked: dict[str, np.ndarray],
                   order: str, seed: int = 0) -> dict[str, list[tuple[int, int]]]:
    """For each query id: the exemplars in prompt order as (pool index, label shown). `same_type` reads the
    whole ranking (`rank_depth`): the nearest memes of the query's type first, then the nearest others."""
    out: dict[str, list[tuple[int, int]]] = {}
    p_hateful = float(np.mean([m.label for m in pool]))
    for qi, q in enumerate(queries):
        rng = random.Random(f"{seed}|{setting.name}|{q.id}")
        if setting.n == 0:
            out[q.id] = []
            continue
        if setting.exemplars == "random":
            idx = rng.sample(range(len(pool)), setting.n)
        elif setting.exemplars == "same_type":
            if q.type is None:
                raise ValueError(f"setting {setting.name}: query {q.id} has no interaction type (same_type "
                                 f"exemplars need a dataset that gives one: MemeWorld)")
            row = [int(j) for j in ranked[setting.retriever][qi]]
            idx = ([j for j in row if pool[j].type == q.type] + [j for j in row if pool[j].type != q.type])[:setting.n]
        else:
            idx = [int(j) for j in ranked[setting.retriever][qi, :setting.n]]
        labels = [pool[j].label for j in idx]
        if setting.exemplars == "shuffled_labels":
            labels = [int(rng.random() < p_hateful) for _ in idx]
        out[q.id] = order_exemplars(list(zip(idx, labels)), order)
    return out


def silver_needs(plans: Sequence[dict[str, list[tuple[int, int]]]]) -> tuple[set[int], set[tuple[int, int]], set[int]]:
    """Which pool memes need a caption, which (meme, label) pairs an explanation, and which memes an
    intervention (those shown as hateful)."""
    caps, expl, iv = set(), set(), set()
    for plan in plans:
        for shots in plan.values():
            for j, lab in shots:
                caps.add(j)
                expl.add((j, lab))
                if lab == 1:
                    iv.add(j)
    return caps, expl, iv


# ----------------------------------------------------------------------------- running
@dataclass
class Prediction:
    id: str
    gold: int
    setting: str
    status: str
    label: int | None
    explanation: str
    intervention: str
    truncated: bool
    dropped_intervention: bool
    exemplar_ids: list[str]
    shown_labels: list[int]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    raw: str = ""


def run_setting(chat, setting: Setting, queries: Sequence[Meme], pool: Sequence[Meme],
                plan: dict[str, list[tuple[int, int]]], silver: dict[str, Any], tpl: SeiTemplates,
                definitions: str, max_new_tokens: int = 100, temperature: float = 0.001, images: bool = True,
                parser: str = "strict", progress: bool = True, string_max_length: int | None = None
                ) -> tuple[list[Prediction], dict[str, Any]]:
    """Every query through the chat model under one setting. `silver`: captions {pool index: str},
    explanations {(pool index, label): str}, interventions {pool index: str}. `string_max_length`
    caps a structured answer's free strings (None: the schema as written)."""
    convs = []
    for q in queries:
        shots = [replace(pool[j], label=lab, caption=silver["captions"][j], explanation=silver["explanations"][(j, lab)],
                         intervention=silver["interventions"].get(j, "") if lab == 1 else "")
                 for j, lab in plan[q.id]]
        convs.append(build_conversation(q, shots, tpl, definitions, images, labels_only=setting.labels_only))
    params = GenParams(temperature=temperature, max_new_tokens=max_new_tokens, replicate=setting.replicate,
                       json_schema=answer_schema(string_max_length) if setting.structured else None)
    before = (chat.stats.requests, chat.stats.prompt_tokens, chat.stats.completion_tokens)
    t0 = time.perf_counter()
    res = chat.generate_many(convs, params, desc=setting.name, progress=progress)
    wall = time.perf_counter() - t0
    preds = []
    for q, r in zip(queries, res):
        a = parse_answer(r.text, r.status, r.finish_reason, r.parsed, parser)
        preds.append(Prediction(q.id, int(q.label), setting.name, a.status, a.label, a.explanation, a.intervention,
                                a.truncated, a.dropped_intervention, [pool[j].id for j, _ in plan[q.id]],
                                [lab for _, lab in plan[q.id]], int(r.usage.get("prompt_tokens", 0)),
                                int(r.usage.get("completion_tokens", 0)), r.text))
    # calls and wall time of this run (0 and ~0 when replayed from the cache), and the latency each
    # answer took when it was made (kept in the cache: the cold cost, whatever run reads it)
    cost = {"calls": chat.stats.requests - before[0], "cache_hits": sum(r.from_cache for r in res),
            "prompt_tokens": sum(p.prompt_tokens for p in preds),
            "completion_tokens": sum(p.completion_tokens for p in preds), "wall_s": wall,
            "model_latency_s": float(sum(r.latency_s for r in res))}
    return preds, cost


# ----------------------------------------------------------------------------- scoring
def classification(preds: Sequence[Prediction]) -> dict[str, Any]:
    """Accuracy and macro-F1 over every query; an answer with no label counts as wrong (it is
    scored as the opposite of the gold label) and is counted by status. `hateful_if_benign` and
    `hateful_if_hateful`: the share answered "hateful" among the benign and among the hateful memes (a
    setting whose first share exceeds its second answers against the gold label, below the majority line)."""
    rep = classification_report([p.gold for p in preds], [p.label if p.label in (0, 1) else None for p in preds],
                                labels=[0, 1])
    st = Counter(p.status for p in preds)
    return {"acc": rep.get("accuracy", float("nan")), "macro_f1": rep.get("macro_f1", float("nan")),
            "n": len(preds), **{f"n_{s}": st.get(s, 0) for s in STATUSES},
            "support": sum(bool(p.intervention) for p in preds),
            "n_truncated": sum(p.truncated for p in preds),
            "n_dropped_interventions": sum(p.dropped_intervention for p in preds),
            "pred_hateful_share": float(np.mean([p.label == 1 for p in preds])) if preds else float("nan"),
            **{f"hateful_if_{name}": float(np.mean([p.label == 1 for p in preds if p.gold == g]))
               if any(p.gold == g for p in preds) else float("nan") for g, name in ((0, "benign"), (1, "hateful"))}}


def generation_scores(preds: Sequence[Prediction], gold_explanations: dict[str, list[str]],
                      gold_interventions: dict[str, list[str]], semsim_model: str = "minilm",
                      bertscore=None, stemmer: bool = False) -> dict[str, Any]:
    """Explanations: every query with a gold explanation and a generated one (n beside the mean).
    Interventions: queries with a gold intervention (gold hateful) and a generated one."""
    ex = [(p.explanation, gold_explanations[p.id]) for p in preds if p.id in gold_explanations and p.explanation]
    iv = [(p.intervention, gold_interventions[p.id]) for p in preds if p.id in gold_interventions and p.intervention]
    e = score_texts([a for a, _ in ex], [b for _, b in ex], semsim_model, bertscore, stemmer)
    i = score_texts([a for a, _ in iv], [b for _, b in iv], semsim_model, bertscore, stemmer)
    return {**{f"expl_{k}": v for k, v in e.items()}, **{f"int_{k}": v for k, v in i.items()}}


def subgroup(gold: int, pred: int | None) -> str | None:
    """cp (gold hateful, predicted hateful), cn, wp (predicted hateful, gold not), wn."""
    if pred not in (0, 1):
        return None
    return {(1, 1): "cp", (0, 0): "cn", (0, 1): "wp", (1, 0): "wn"}[(gold, pred)]


BALANCE_BY = ("label", "type")


def balanced_subset(memes: Sequence[Meme], n: int, seed: int = 0, by: str = "label") -> list[Meme]:
    """n memes drawn with a fixed seed, in the input order; 0: all.

    `by="label"`: half of each label (as far as each label allows). `by="type"`: an equal share of
    each interaction type (MemeWorld's SMI types; the first n mod k types in sorted order get one
    more), filled from the other types where one runs short. The type draw is nested: each type's
    memes are shuffled once (seeded by the seed and the type) and the draw takes a prefix of every
    type's shuffle, so while no type runs short a smaller n with the same seed gives a subset of a
    larger one (a named balanced subset of the evaluation set is drawn this way)."""
    if by not in BALANCE_BY:
        raise ValueError(f"balance must be one of {BALANCE_BY}, got {by!r}")
    if not n or n >= len(memes):
        return list(memes)
    if by == "type":
        untyped = [m.id for m in memes if not m.type]
        if untyped:
            raise ValueError(f"a type-balanced draw needs every meme's interaction type; {len(untyped)} have none "
                             f"(e.g. meme {untyped[0]}): use balance 'label' for data without types")
        strata = {t: [m for m in memes if m.type == t] for t in sorted({m.type for m in memes})}
        order = {t: random.Random(f"{seed}|{t}").sample(v, len(v)) for t, v in strata.items()}
        k = len(strata)
        quota = {t: n // k + (i < n % k) for i, t in enumerate(strata)}
        take = {t: min(quota[t], len(v)) for t, v in order.items()}
        short = n - sum(take.values())
        while short > 0:                     # a short type's places go round the others in sorted order
            for t, v in order.items():
                if short and take[t] < len(v):
                    take[t] += 1
                    short -= 1
        picked = {m.id for t, v in order.items() for m in v[:take[t]]}
        return [m for m in memes if m.id in picked]
    rng = random.Random(seed)
    by_label = {0: [m for m in memes if m.label == 0], 1: [m for m in memes if m.label == 1]}
    k1 = min(len(by_label[1]), n // 2)
    k0 = min(len(by_label[0]), n - k1)
    k1 = min(len(by_label[1]), n - k0)
    picked = {m.id for m in rng.sample(by_label[0], k0) + rng.sample(by_label[1], k1)}
    return [m for m in memes if m.id in picked]


def predictions_to_json(preds: Sequence[Prediction]) -> list[dict[str, Any]]:
    return [asdict(p) for p in preds]
