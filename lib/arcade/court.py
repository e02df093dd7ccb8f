"""ARCADE: a prosecutor / defender / judge debate with a gated dual track (Sun et al., ACL 2026 Findings).

    court = Court(chat, CourtConfig(class_mode="multiclass", rounds=3))
    results = court.run_many(samples)                 # samples: H-VLI records (lib.data.datasets.load_hvli)
    report = evaluate(results, "multiclass")          # official and corrected views

One sample's trial:
1. rapid scan: the prosecutor lists 0-2 EXPLICIT cues (temperature 0.0);
2. cues found -> Track I: prosecutor (0.8) brings 1-3 cues, defender (0.8) rebuts them, judge
   (0.1) gives the verdict {label, label_str, reason};
3. no cue -> Track II: K rounds of indirect prosecutor and defender (0.7), then the judge on the
   transcript; when the first indirect prosecutor finds nothing, summary dismissal (label 0).
`run_mode: none` is the direct baseline: one classification call (0.8).

Two readings of "debate" (`debate_visibility`): `transcript` (default, the debate the paper
describes: each side sees the transcript so far) and `official` (the official code: the Track II
debaters see only the post, round-2 prompts included; only the judge reads the transcript).
Two parsers (`parse`): `structured` (each role's JSON schema, constrained decoding where the
backend has it) and `official` (free text read leniently with json-repair, as the official code).
A failed prosecutor or defender (`debater_failure`): `stop` ends the trial (the compendium's) or
`pass_on` hands its failure object to the other side and the judge (the official code's).
`CourtConfig.official()` sets all three to the official behaviour; tests/test_debate_official.py
checks it against a restatement of the official control flow on scripted answers.

Prompts are data: `params/prompts/arcade/{<class_mode>,common}/<stage>.txt` (system prompts, the
compendium's own wording), `params/prompts/arcade/user/<stage>.txt` (the user turn's task lines),
schemas `params/schemas/arcade_<stage>.json`. A profile can point `prompt_dir` at other files, or
`official_prompts_repo` at a checkout of the official repository, whose prompt constants are then
read from its `court_prompts.py` / `court_prompts_binary.py` (nothing of them is copied here).
`prompt_layout: definition_first` (a named option; `role_first`, the files as written, is the
default) moves the definition and world knowledge to the head of every role's system prompt, so
one shared prefix is reused by the server's prompt cache across roles.

Every call goes through the response cache: a rerun makes zero calls and a crash loses nothing.
Samples run concurrently on a bounded pool; the stages of one sample run in order.
"""
from __future__ import annotations

import hashlib
import json
import runpy
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import json_repair
import jsonschema
from tqdm.auto import tqdm

from lib import ROOT
from lib.models.chat import Chat, ChatResult, GenParams, check_json_bounds, image, system, text
from lib.models.chat.structured import ambiguity, cap_string_lengths  # noqa: F401 - cap_string_lengths also importable from here
from lib.data.records import HVLI_DIFFICULTY, HVLI_LABELS, HVLI_TYPES

# H-VLI's label codes, interaction types and difficulty by type: the dataset module's, one definition
LABELS, TYPES, DIFFICULTY = HVLI_LABELS, HVLI_TYPES, HVLI_DIFFICULTY
STAGES = ("rapid_scan", "prosecutor", "defender", "judge", "prosecutor_indirect", "defender_indirect",
          "prosecutor_round2", "defender_round2", "judge_indirect", "baseline")
ROLE = {"rapid_scan": "prosecutor", "prosecutor": "prosecutor", "defender": "defender", "judge": "judge",
        "prosecutor_indirect": "prosecutor", "defender_indirect": "defender", "prosecutor_round2": "prosecutor",
        "defender_round2": "defender", "judge_indirect": "judge", "baseline": "baseline"}
#: The official prompt constant behind each stage (court_prompts.py / court_prompts_binary.py).
OFFICIAL_CONSTANTS = {"rapid_scan": "PROSECUTOR_DIRECT_PROMPT", "prosecutor": "PROSECUTOR_PROMPT",
                      "defender": "DEFENDER_PROMPT", "judge": "JUDGE_PROMPT",
                      "prosecutor_indirect": "PROSECUTOR_INDIRECT_PROMPT", "defender_indirect": "DEFENDER_INDIRECT_PROMPT",
                      "prosecutor_round2": "PROSECUTOR_ROUND_2_PROMPT", "defender_round2": "DEFENSE_ROUND_2_PROMPT",
                      "judge_indirect": "JUDGE_PROMPT_INDIRECT", "baseline": "SAFETY_PROMPT"}
DEFAULT_TEMPERATURES = {"rapid_scan": 0.0, "prosecutor": 0.8, "defender": 0.8, "judge": 0.1,
                        "prosecutor_indirect": 0.7, "defender_indirect": 0.7, "prosecutor_round2": 0.7,
                        "defender_round2": 0.7, "judge_indirect": 0.1, "baseline": 0.8}
DEFAULT_MAX_TOKENS = {"rapid_scan": 320, "prosecutor": 400, "defender": 360, "judge": 160,
                      "prosecutor_indirect": 320, "defender_indirect": 360, "prosecutor_round2": 360,
                      "defender_round2": 300, "judge_indirect": 160, "baseline": 120}


#: The text part sent in place of a post's image when its file is absent (the official code's behaviour).
MISSING_IMAGE = "[Image missing]"


class CourtError(ValueError):
    """A bad court configuration or prompt set; the message names the setting or file."""


@dataclass
class CourtConfig:
    """How the court runs (a profile's `05_debate` section feeds it)."""
    class_mode: str = "multiclass"            # multiclass (labels 0-5) | binary (0-1)
    run_mode: str = "arcade"                  # arcade | none (the direct baseline)
    rounds: int = 3                           # K, Track II debate rounds
    debate_visibility: str = "transcript"     # transcript (each side sees the debate so far) | official (blind)
    parse: str = "structured"                 # structured (JSON schema) | official (json-repair on free text)
    debater_failure: str = "stop"             # a refused, blocked, failed or unreadable prosecutor / defender:
                                              #   stop (the compendium's: the trial ends, the post is refused
                                              #   and reported by cause; an unreadable answer counts as no cues)
                                              #   | pass_on (the official code: the failure is passed to the
                                              #   other side and the judge, who still rules)
    gate: bool = True                         # False: no rapid scan, every sample through Track II (ablation)
    repair_fallback: bool = True              # structured: an answer that fails its schema is read with
                                              #   json-repair and kept if the repaired value fits the schema
    temperatures: dict = field(default_factory=dict)   # stage -> temperature (defaults: the official code's)
    max_new_tokens: dict = field(default_factory=dict)  # stage -> max new tokens
    seed: int = 0
    prompt_dir: str = "params/prompts/arcade"
    schema_dir: str = "params/schemas"
    official_prompts_repo: str | None = None  # a checkout of the official repository: its prompts, not ours
    world_knowledge: str | None = None        # a file of what a moderator of these posts knows (who the groups
                                              #   are, which category each belongs to, what their symbols mean),
                                              #   added after the definition; None: the definition alone (official)
    prompt_layout: str = "role_first"         # role_first (each role's system prompt names the role, then the
                                              #   definition, as the official prompts do) | definition_first (the
                                              #   definition and world knowledge open every role's prompt: one
                                              #   shared prefix the server's prompt cache reuses across roles)
    string_max_length: int | None = None      # caps every string field's maxLength in the court's schemas (a
                                              #   short-answer option for a small model that fills each field to
                                              #   its limit); None: the schemas as written (official)
    workers: int = 8                          # samples in flight
    replicate: int = 0                        # > 0: a cold run (the same requests asked afresh, cached apart)

    def __post_init__(self):
        for name, value, allowed in (("class_mode", self.class_mode, ("multiclass", "binary")),
                                     ("run_mode", self.run_mode, ("arcade", "none")),
                                     ("debate_visibility", self.debate_visibility, ("transcript", "official")),
                                     ("parse", self.parse, ("structured", "official")),
                                     ("debater_failure", self.debater_failure, ("stop", "pass_on")),
                                     ("prompt_layout", self.prompt_layout, ("role_first", "definition_first"))):
            if value not in allowed:
                raise CourtError(f"court setting {name}={value!r}; expected one of {', '.join(allowed)}")
        if self.rounds < 1:
            raise CourtError(f"court setting rounds={self.rounds}; at least 1 round is needed")
        if self.string_max_length is not None and (isinstance(self.string_max_length, bool)
                                                   or not isinstance(self.string_max_length, int)
                                                   or self.string_max_length < 1):
            raise CourtError(f"court setting string_max_length={self.string_max_length!r}; expected a positive "
                             f"integer or null (the schemas as written)")
        for name, table in (("temperatures", self.temperatures), ("max_new_tokens", self.max_new_tokens)):
            unknown = set(table) - set(STAGES)
            if unknown:
                raise CourtError(f"court setting {name} names unknown stage(s) {', '.join(sorted(unknown))} "
                                 f"(stages: {', '.join(STAGES)})")

    @classmethod
    def official(cls, **over: Any) -> "CourtConfig":
        """Every setting at the official code's behaviour (blind Track II debaters, free text read with
        json-repair, a failed debater passed on); `over` changes any of them."""
        return cls(**{"debate_visibility": "official", "parse": "official", "debater_failure": "pass_on", **over})

    def temperature(self, stage: str) -> float:
        return float(self.temperatures.get(stage, DEFAULT_TEMPERATURES[stage]))

    def tokens(self, stage: str) -> int:
        return int(self.max_new_tokens.get(stage, DEFAULT_MAX_TOKENS[stage]))


# ----------------------------------------------------------------------------- prompts
@dataclass(frozen=True)
class Template:
    text: str
    id: str          # file (or official constant) and content digest: saved in every call's trace


class Prompts:
    """System prompts, user task lines and schemas for one class mode."""

    def __init__(self, cfg: CourtConfig):
        self.cfg = cfg
        base = Path(cfg.prompt_dir)
        self.base = base if base.is_absolute() else ROOT / base
        schemas = Path(cfg.schema_dir)
        self.schema_dir = schemas if schemas.is_absolute() else ROOT / schemas
        self.official = read_official_prompts(cfg.official_prompts_repo, cfg.class_mode) \
            if cfg.official_prompts_repo else None
        if self.official is not None and cfg.prompt_layout != "role_first":
            raise CourtError("prompt_layout definition_first rearranges the compendium's prompt files; the official "
                             "prompts (official_prompts_repo) are used as written: set prompt_layout: role_first")
        definition = self._file(self.base / "common" / "definition.txt")
        if cfg.world_knowledge:
            wk = Path(cfg.world_knowledge)
            world = self._file(wk if wk.is_absolute() else ROOT / wk)
            definition = Template(f"{definition.text}\n{world.text}", f"{definition.id}+{world.id}")
        self._system = {s: self._system_prompt(s, definition) for s in STAGES}
        self._user = {s: self._file(self.base / "user" / f"{s}.txt") for s in STAGES}
        self.post = self._file(self.base / "user" / "post.txt")
        self.transcript_block = self._file(self.base / "user" / "transcript_block.txt")

    def _file(self, path: Path) -> Template:
        if not path.exists():
            raise CourtError(f"prompt template {path} does not exist")
        t = path.read_text(encoding="utf-8").strip("\n")
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        return Template(t, f"{rel}#{hashlib.sha256(t.encode()).hexdigest()[:8]}")

    def _system_prompt(self, stage: str, definition: Template) -> Template:
        if self.official is not None:
            t = self.official[stage]
            return Template(t, f"official:{OFFICIAL_CONSTANTS[stage]}#{hashlib.sha256(t.encode()).hexdigest()[:8]}")
        for d in (self.cfg.class_mode, "common"):
            p = self.base / d / f"{stage}.txt"
            if p.exists():
                tpl = self._file(p)
                if self.cfg.prompt_layout == "definition_first" and "{definition}" in tpl.text:
                    rest = "\n".join(line for line in tpl.text.split("\n") if line.strip() != "{definition}")
                    if "{definition}" in rest:
                        raise CourtError(f"{p}: prompt_layout definition_first needs {{definition}} on a line of its own")
                    return Template(f"{definition.text}\n{rest}", f"{tpl.id}+definition_first")
                return Template(tpl.text.replace("{definition}", definition.text), tpl.id)
        raise CourtError(f"no prompt for stage '{stage}' in {self.base}/{self.cfg.class_mode} or {self.base}/common")

    def system(self, stage: str) -> Template:
        return self._system[stage]

    def user(self, stage: str) -> Template:
        return self._user[stage]

    def schema(self, stage: str) -> dict[str, Any]:
        name = {"rapid_scan": "arcade_rapid_scan", "prosecutor": "arcade_prosecutor",
                "prosecutor_indirect": "arcade_prosecutor_indirect", "prosecutor_round2": "arcade_prosecutor_round2",
                "defender": "arcade_defender", "defender_indirect": "arcade_defender",
                "defender_round2": "arcade_defender_round2", "judge": f"arcade_verdict_{self.cfg.class_mode}",
                "judge_indirect": f"arcade_verdict_{self.cfg.class_mode}",
                "baseline": f"arcade_baseline_{self.cfg.class_mode}"}[stage]
        path = self.schema_dir / f"{name}.json"
        if not path.exists():
            raise CourtError(f"schema {path} does not exist")
        schema = json.loads(path.read_text(encoding="utf-8"))
        return cap_string_lengths(schema, self.cfg.string_max_length) if self.cfg.string_max_length else schema


def read_official_prompts(repo: str | Path, class_mode: str) -> dict[str, str]:
    """The official prompt constants, read from a user's own checkout of the official repository
    (`court_prompts.py`, or `court_prompts_binary.py` for the binary mode). Nothing is copied."""
    path = Path(repo) / ("court_prompts_binary.py" if class_mode == "binary" else "court_prompts.py")
    if not path.exists():
        raise CourtError(f"official_prompts_repo: {path} does not exist (point it at a checkout of the "
                         f"official ARCADE repository)")
    ns = runpy.run_path(str(path))
    missing = [c for c in OFFICIAL_CONSTANTS.values() if not isinstance(ns.get(c), str)]
    if missing:
        raise CourtError(f"{path}: no string constant(s) {', '.join(missing)}")
    return {stage: ns[const] for stage, const in OFFICIAL_CONSTANTS.items()}


# ----------------------------------------------------------------------------- parsing
def fenced_blocks(text: str) -> list[str]:
    """The official code's fenced blocks, found in linear time: the text between each pair of
    consecutive ``` markers, a leading `json` tag (any letter case) dropped, surrounding whitespace
    stripped; a block with another tag keeps its tag line, as the official regex does. (The regex
    itself, "```(?:json)?\\s*(.*?)\\s*```" with re.S, backtracks for seconds on a fence followed by
    a few thousand spaces; a test checks the two agree on every short string.)"""
    parts = text.split("```")
    out = []
    for i in range(1, len(parts) - 1, 2):
        block = parts[i]
        if block[:4].lower() == "json":
            block = block[4:]
        out.append(block.strip())
    return out


#: What the official client returns for a value that is neither an object, a list nor a string.
EMPTY_RESPONSE = {"error": "Empty Response", "refusal": True}


def official_parse(raw: str | None) -> Any:
    """The official code's lenient reading of a free-text answer (`clean_json_like` and `call_llm`).

    The last fenced block (tag `json` in any case, or none) if there is one, else the whole stripped
    text, goes through json-repair. An object or a list is the answer; a string becomes an error
    dict (`Output format is not JSON`, not a refusal; the text is lost); anything else (null, a bare
    number such as `0` or `4`, a boolean) becomes `EMPTY_RESPONSE`, a refusal: a judge answering
    `4` is refused, and a rapid scan answering `1` fails the gate.
    """
    if raw is None:
        return dict(EMPTY_RESPONSE)
    src = str(raw).strip()
    try:
        check_json_bounds(src)          # past MAX_JSON_CHARS or MAX_JSON_DEPTH: not JSON (json-repair is slow there)
    except ValueError:
        return {"content": "", "error": "Output format is not JSON", "refusal": False}
    blocks = fenced_blocks(src)
    src = blocks[-1] if blocks else src
    try:
        value = json_repair.repair_json(src, return_objects=True)
    except Exception:  # noqa: BLE001 - the official fallback chain ends in an error dict too
        value = ""
    if isinstance(value, (dict, list)):
        return value
    if isinstance(value, str):
        return {"content": value, "error": "Output format is not JSON", "refusal": False}
    return dict(EMPTY_RESPONSE)


def official_label(value: Any) -> int:
    """The official evaluator's reading of a verdict's label: `int(label)`, -1 when it is missing or
    `int()` fails. It coerces (`1.9` -> 1, `true` -> 1, `"1"` -> 1) and keeps out-of-range integers
    (7 stays 7): only the official view uses it; the corrected view reads labels with `strict_label`."""
    if value is None:
        return -1
    try:
        return int(value)
    except Exception:  # noqa: BLE001 - the official `except:` (ValueError, TypeError, OverflowError)
        return -1


def strict_label(value: Any, class_mode: str) -> int | None:
    """A verdict's label as the corrected view reads it: an integer (not a boolean, not a float, not
    a string) among the class mode's labels; anything else is None (unparseable), never coerced."""
    allowed = (0, 1) if class_mode == "binary" else tuple(LABELS)
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        return None
    return int(value)


def _fits(value: Any, schema: dict[str, Any] | None) -> bool:
    if schema is None:
        return True
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def _is_failure(value: Any) -> bool:
    return isinstance(value, dict) and ("error" in value or value.get("refusal") is True)


# ----------------------------------------------------------------------------- the court
@dataclass
class CallTrace:
    stage: str
    role: str
    round: int
    temperature: float
    template: str
    status: str                    # ok | unparseable | refused | blocked | failed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0
    from_cache: bool = False
    output: Any = None             # the parsed value the court used
    raw: str = ""
    error: str | None = None
    repaired: bool = False         # read by the json-repair fallback after failing the schema


@dataclass
class SampleResult:
    id: str
    gt: int                        # multiclass ground truth (0-5)
    type: str
    difficulty: str
    route: str                     # track1 | track2 | dismissal | baseline | error
    label: int = -1                # the verdict as the corrected view reads it (-1: none usable)
    label_str: str = ""
    reason: str = ""
    status: str = "ok"             # ok | unparseable | refused | blocked | failed
    cause: str | None = None       # the stage whose answer ended the trial when status is not ok
    official_refusal: bool = False  # the official evaluator would exclude this sample
    official_label: int | None = None  # the verdict as the official evaluator reads it (int(), -1 if that fails)
    label_raw: Any = None          # the verdict's label exactly as the judge gave it
    passed_on: list[str] = field(default_factory=list)  # debater stages whose failure went on to the judge
    calls: list[CallTrace] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Stop(Exception):
    """A stage ended the trial (refused, blocked or failed call)."""

    def __init__(self, status: str, stage: str):
        self.status, self.stage = status, stage


class Court:
    """Runs ARCADE (or the direct baseline) with any chat backend (a `lib.models.chat.Chat`)."""

    def __init__(self, chat: Chat, cfg: CourtConfig = CourtConfig(), judge_chat: Chat | None = None):
        self.chat = chat
        self.cfg = cfg
        self.prompts = Prompts(cfg)
        # another model for the verdicts (the judge's stages and the direct baseline's call), e.g. the judge
        # adapted to MemeWorld (lib.arcade.adapt); None: `chat` answers every stage
        self.judge_chat = judge_chat

    def chat_for(self, stage: str) -> Chat:
        """The model that answers `stage`: the judge's model for a verdict, else the debaters'."""
        return self.judge_chat if self.judge_chat is not None and ROLE[stage] in ("judge", "baseline") else self.chat

    # -- one call
    def _messages(self, stage: str, sample, user_text: str) -> list[dict[str, Any]]:
        post = text(self.prompts.post.text.format(text=sample.text))
        # an absent image file: the official code's text part in its place, in every call
        img = [image(sample.img_path)] if Path(sample.img_path).is_file() else [text(MISSING_IMAGE)]
        tail = [text("\n" + user_text)] if user_text else []
        if stage == "baseline":
            # the baseline's layout: an empty system turn, the instructions as the first user part
            return [system(""), {"role": "user", "content": [text(self.prompts.system(stage).text + "\n"), post,
                                                             *img, *tail]}]
        return [system(self.prompts.system(stage).text), {"role": "user", "content": [post, *img, *tail]}]

    def _call(self, stage: str, sample, round_: int, result: SampleResult, **fields: Any) -> tuple[str, Any]:
        """One stage's call, traced: (status, value). With status `ok` the value is the answer the court
        uses; otherwise it is what the official code would carry on with (its failure dict, or the
        parsed value that was not an answer)."""
        cfg = self.cfg
        user_text = self.prompts.user(stage).text.format(**fields)
        params = GenParams(temperature=cfg.temperature(stage), max_new_tokens=cfg.tokens(stage), seed=cfg.seed,
                           replicate=cfg.replicate, json_schema=self.prompts.schema(stage) if cfg.parse == "structured" else None)
        r: ChatResult = self.chat_for(stage).generate(self._messages(stage, sample, user_text), params)
        status, value, repaired_flag = r.status, None, False
        if status in ("refused", "blocked", "failed"):
            # what the official client hands on for a refused, rejected or failed request
            value = {"refusal": True, "error": r.error or status}
        elif status == "ok" and cfg.parse == "structured":
            value = _unwrap(r.parsed)
        elif status == "ok":
            value = official_parse(r.text)
            if _is_failure(value):
                # an answer that is itself a refusal object is a refusal; a string or a bare value is unreadable
                status = "refused" if value.get("refusal") is True and value != EMPTY_RESPONSE else "unparseable"
        elif status == "unparseable":
            value = {"error": "Output does not fit the schema", "refusal": False}
            if cfg.parse == "structured" and cfg.repair_fallback and not ambiguity(r.text):
                # the fallback: the official lenient reader, kept only when what it recovers fits the schema
                # (a cue list cut off by max_new_tokens, JSON wrapped in prose)
                repaired = official_parse(r.text)
                if not _is_failure(repaired) and _fits(repaired, params.json_schema):
                    status, value, repaired_flag = "ok", _unwrap(repaired), True
        trace = CallTrace(stage, ROLE[stage], round_, params.temperature, self.prompts.system(stage).id, status,
                          r.usage.get("prompt_tokens", 0), r.usage.get("completion_tokens", 0),
                          r.usage.get("cached_tokens", 0), round(r.latency_s, 4), r.from_cache, value, r.text,
                          r.error, repaired_flag)
        result.calls.append(trace)
        return status, value

    def _debater(self, stage: str, sample, round_: int, res: SampleResult, **fields: Any) -> tuple[bool, Any]:
        """A prosecutor's or defender's answer: (answered, value). A failure either goes on to the
        other side and the judge as the official code passes it (`debater_failure: pass_on`), or ends
        the trial when the call was refused, blocked or failed and counts as no cues otherwise (`stop`)."""
        status, value = self._call(stage, sample, round_, res, **fields)
        if status == "ok":
            return True, value
        if self.cfg.debater_failure == "pass_on":
            res.passed_on.append(stage)
            return False, value
        if status in ("refused", "blocked", "failed"):
            raise _Stop(status, stage)
        return False, []

    # -- one sample
    def run(self, sample) -> SampleResult:
        typ = sample.meta.get("type") or "unknown"        # unknown: a post whose labels do not give its type
        res = SampleResult(str(sample.id), int(sample.meta.get("final_label_multiclass", sample.label or 0)), typ,
                           DIFFICULTY.get(typ, "Unknown"), route="baseline" if self.cfg.run_mode == "none" else "error")
        try:
            if self.cfg.run_mode == "none":
                self._verdict(res, "baseline", sample, 0)
            else:
                self._arcade(sample, res)
        except _Stop as stop:
            res.status, res.cause, res.label, res.official_label = stop.status, stop.stage, -1, -1
            # the official code turns refusals, blocks and transient failures alike into refusals
            res.official_refusal = True
        return res

    def _arcade(self, sample, res: SampleResult) -> None:
        if not self.cfg.gate:
            return self._track2(sample, res)
        status, scan = self._call("rapid_scan", sample, 0, res)
        if status != "ok" or _is_failure(scan):
            # the official gate: a failed rapid scan ends the trial as a refusal ("Stage A Failed")
            res.route, res.cause, res.official_refusal = "error", "rapid_scan", True
            res.status = "unparseable" if status == "ok" else status
            res.label, res.official_label = -1, -1
            return
        if isinstance(scan, list) and scan:
            res.route = "track1"
            _, p = self._debater("prosecutor", sample, 1, res)
            _, d = self._debater("defender", sample, 1, res, accusations=self._dumps(p))
            res.transcript = [{"round": 1, "prosecutor": p, "defense": d}]
            self._verdict(res, "judge", sample, 1, accusations=self._dumps(p), rebuttals=self._dumps(d))
            return
        self._track2(sample, res)

    def _track2(self, sample, res: SampleResult) -> None:
        res.route = "track2"
        history: list[dict[str, Any]] = []
        blind = self.cfg.debate_visibility == "official"
        for rnd in range(1, self.cfg.rounds + 1):
            if rnd == 1:
                answered, p = self._debater("prosecutor_indirect", sample, rnd, res)
                if answered and isinstance(p, list) and not p:
                    res.route, res.label, res.label_str, res.reason = "dismissal", 0, LABELS[0], "No cues found."
                    res.official_label = res.label_raw = 0
                    return
            else:
                _, p = self._debater("prosecutor_round2", sample, rnd, res,
                                     transcript_block="" if blind else self._block(history))
            current = history + [{"round": rnd, "prosecutor": p}]
            d_stage = "defender_indirect" if rnd == 1 else "defender_round2"
            _, d = self._debater(d_stage, sample, rnd, res, transcript_block="" if blind else self._block(current))
            history.append({"round": rnd, "prosecutor": p, "defense": d})
        res.transcript = history
        self._verdict(res, "judge_indirect", sample, self.cfg.rounds + 1, transcript=self._dumps(history))

    def _dumps(self, v: Any) -> str:
        # the official code writes debate JSON with json.dumps' defaults (non-ASCII escaped)
        return json.dumps(v) if self.cfg.debate_visibility == "official" else _dumps(v)

    def _block(self, history: list[dict[str, Any]]) -> str:
        return self.prompts.transcript_block.text.format(transcript=self._dumps(history)) + "\n" if history else ""

    def _verdict(self, res: SampleResult, stage: str, sample, round_: int, **fields: Any) -> None:
        """The judge's (or the direct baseline's) call and the verdict read from it in both views.
        Official: a refusal object (a refused call, a refusal the model wrote, a bare number or null)
        excludes the post; any other value is scored with `int(label)`, -1 when that fails. Corrected:
        only an answer whose label is one of the class mode's labels counts; anything else is
        unparseable (-1), never coerced."""
        status, v = self._call(stage, sample, round_, res, **fields)
        if status in ("refused", "blocked", "failed"):
            raise _Stop(status, stage)
        verdict = v if isinstance(v, dict) else {}
        res.official_refusal = verdict.get("refusal") is True
        res.label_raw = verdict.get("label")
        res.official_label = -1 if res.official_refusal else official_label(res.label_raw)
        res.label_str = str(verdict.get("label_str", ""))
        res.reason = str(verdict.get("reason", ""))
        # corrected view: a verdict whose JSON has two readings (a repeated key, two objects) is unparseable,
        # whichever value json-repair kept; the official view keeps the official reading
        raw = res.calls[-1].raw if res.calls else ""
        strict = strict_label(res.label_raw, self.cfg.class_mode) if status == "ok" and not ambiguity(raw) else None
        if strict is None:
            res.status, res.cause, res.label = "unparseable", stage, -1
        else:
            res.label = strict

    # -- many samples
    def run_many(self, samples: Sequence[Any], progress: bool = True, desc: str | None = None) -> list[SampleResult]:
        """Trials in input order; samples concurrently on a bounded pool, each sample's stages in order."""
        out: list[SampleResult | None] = [None] * len(samples)
        bar = tqdm(total=len(samples), desc=desc or f"court ({self.cfg.run_mode})", disable=not progress)
        lock = threading.Lock()

        def one(i: int) -> None:
            out[i] = self.run(samples[i])
            with lock:
                bar.update(1)
        with ThreadPoolExecutor(max_workers=max(1, self.cfg.workers)) as pool:
            for f in [pool.submit(one, i) for i in range(len(samples))]:
                f.result()
        bar.close()
        return [r for r in out if r is not None]


def _unwrap(parsed: Any) -> Any:
    """Structured answers come as objects ({"cues": [...]}, {"rebuttals": [...]}); the court works on the lists."""
    if isinstance(parsed, dict) and len(parsed) == 1 and next(iter(parsed)) in ("cues", "rebuttals"):
        return next(iter(parsed.values()))
    return parsed


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)

