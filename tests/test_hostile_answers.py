"""Whatever a model or server answers, a run goes on: every parser is total (a defined status,
never an exception), linear in the answer's length, never coerces a non-label into a label, and
every answer is storable in the response cache and replayed from it. Families of inputs, not
single strings."""
import json
import random
import re
import threading
import time

import pytest

from lib.models.chat import MAX_JSON_DEPTH, Chat, ChatResult, GenParams, extract_json, loads_strict, user
from lib.arcade.court import Court, CourtConfig, fenced_blocks, official_label, official_parse, strict_label
from lib.arcade.scoring import evaluate
from lib.sei.fewshot import parse_answer

LINEAR_S = 2.0      # generous: every input below is parsed in milliseconds; the quadratic readers took 5-200 s


def nested(open_, close, n, inner="1"):
    return open_ * n + inner + close * n


DEEP = [nested("[", "]", n) for n in (MAX_JSON_DEPTH + 1, 1000, 100_000)] + \
       [nested('{"a":', "}", n) for n in (MAX_JSON_DEPTH + 1, 5000, 50_000)] + \
       ["[" * 100_000, "{" * 100_000, "[{" * 50_000, "x {" * 60_000]
LONG = ["." * 16_000, "." * 1_000_000, "a" * 1_000_000, "{" + " " * 1_000_000, '{"a": "' + "x" * 1_000_000 + '"}',
        "```" + " " * 50_000, "``` " * 50_000, "\\" * 1_000_000, '"' * 1_000_000, "hateful " * 100_000,
        "-" * 200_000, "\n" * 200_000, "{}" * 200_000]
NUMBERS = ['{"label": Infinity}', '{"label": -Infinity}', '{"label": NaN}', '{"label": 1e999}', '{"label": -1e999}',
           '{"label": 1' + "0" * 5000 + "}"]
DUPLICATES = ['{"label": 1, "label": 0}', '{"a": {"b": 1, "b": 2}}', 'prose {"label": "x", "label": "y"} prose',
              '[{"k": 1, "k": 1}]']
SURROGATES = ["x \udcff", "\ud800", "\udfff end", "a\ud83d", '{"label": "hateful\udc80"}', "\udcff" * 1000]


def timed(fn, *a, **k):
    t0 = time.perf_counter()
    try:
        out = fn(*a, **k)
    except ValueError as e:
        out = e
    dt = time.perf_counter() - t0
    assert dt < LINEAR_S, (fn.__name__, dt)
    return out


@pytest.mark.parametrize("text", DEEP + LONG + NUMBERS + DUPLICATES + SURROGATES, ids=lambda t: repr(t[:12]))
def test_every_reader_is_total_and_linear(text):
    v = timed(extract_json, text)
    assert isinstance(v, (ValueError, dict, list, str, int, float)) and not isinstance(v, bool) or v is None
    o = timed(official_parse, text)
    assert isinstance(o, (dict, list))
    a = timed(parse_answer, text, parser="lenient")
    assert a.status in ("ok", "unparseable", "refused") and a.label in (None, 0, 1)
    timed(parse_answer, text, parser="strict")
    timed(fenced_blocks, text)


@pytest.mark.parametrize("text", NUMBERS)
def test_non_finite_numbers_are_not_json(text):
    with pytest.raises(ValueError):
        extract_json(text)
    value = official_parse(text)
    assert isinstance(official_label(value.get("label")), int)          # the official reading: -1 or int(), no raise


@pytest.mark.parametrize("text", DUPLICATES)
def test_duplicate_keys_are_an_error_not_the_last_value(text):
    with pytest.raises(ValueError, match="duplicate key"):
        extract_json(text)


@pytest.mark.parametrize("text", [nested("[", "]", MAX_JSON_DEPTH - 1), nested('{"a":', "}", MAX_JSON_DEPTH - 1)])
def test_nesting_within_the_bound_still_reads(text):
    assert extract_json(text) is not None


def test_the_linear_fence_reader_equals_the_official_regex_on_short_strings():
    official = re.compile(r"```(?:json)?\s*([\s\S]*?)\s*```", re.IGNORECASE)
    alphabet = ["`", "```", "json", "JSON", "Json ", " ", "\n", "a", "{", "}", "\t"]
    rng = random.Random(7)
    for _ in range(20_000):
        t = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9)))
        assert fenced_blocks(t) == official.findall(t), repr(t)


class Hostile:
    """A backend answering from a list of texts in turn (optionally with a lone surrogate in its error)."""
    native_schema = True

    def __init__(self, texts):
        self.texts, self.n, self.lock = list(texts), 0, threading.Lock()

    def identity(self):
        return {"model": "hostile"}

    def complete(self, messages, params):
        with self.lock:
            t = self.texts[self.n % len(self.texts)]
            self.n += 1
        return ChatResult(t, model="hostile", error="err \udcff" if self.n % 3 == 0 else None)


SCHEMA = {"type": "object", "properties": {"label": {"type": "integer"}}, "required": ["label"]}


def test_any_answer_is_stored_and_replayed_without_a_crash(tmp_path):
    texts = DEEP[:3] + LONG[:4] + NUMBERS + DUPLICATES + SURROGATES
    convs = [[user(f"post {i}")] for i in range(len(texts))]
    for params in (GenParams(json_schema=SCHEMA), GenParams()):
        backend = Hostile(texts)
        chat = Chat(backend, tmp_path / "cache.sqlite")
        first = chat.generate_many(convs, params, progress=False)
        assert all(r.status in ("ok", "unparseable") for r in first)
        assert all(not re.search(r"[\ud800-\udfff]", r.text + (r.error or "")) for r in first)
        again = Chat(Hostile(["never asked"]), tmp_path / "cache.sqlite")
        replay = again.generate_many(convs, params, progress=False)
        assert again.stats.requests == 0 and [r.text for r in replay] == [r.text for r in first]


@pytest.mark.parametrize("parse", ["structured", "official"])
@pytest.mark.parametrize("class_mode", ["multiclass", "binary"])
def test_a_court_of_hostile_answers_finishes_every_trial(tmp_path, parse, class_mode):
    from dataclasses import dataclass, field
    from pathlib import Path

    @dataclass
    class Post:
        id: str
        text: str = "t"
        img_path: Path = Path("/nonexistent.png")
        label: int = 1
        meta: dict = field(default_factory=lambda: {"type": "011", "final_label_multiclass": 2})
    texts = DEEP[:4] + NUMBERS + DUPLICATES + SURROGATES + ['{"label": 7}', '{"label": 1.9}', '{"label": true}',
                                                             '{"label": "1"}', "7", "[]", '[{"id": 1}]']
    cfg = CourtConfig(parse=parse, class_mode=class_mode, rounds=2, workers=4,
                      **({"debate_visibility": "official", "debater_failure": "pass_on"} if parse == "official" else {}))
    chat = Chat(Hostile(texts), tmp_path / "c.sqlite")
    results = Court(chat, cfg).run_many([Post(str(i)) for i in range(24)], progress=False)
    assert len(results) == 24
    for r in results:
        assert r.status in ("ok", "unparseable", "refused", "blocked", "failed")
        assert r.label in ((0, 1, -1) if class_mode == "binary" else (0, 1, 2, 3, 4, 5, -1))
        json.dumps(r.to_json(), default=str).encode("utf-8")          # every result is writable
    for view in ("official", "corrected"):
        evaluate(results, class_mode, view)


@pytest.mark.parametrize("value", [7, -1, 1.9, 1.0, True, False, "1", "hateful", None, [1], {"a": 1}, float("inf"),
                                   float("nan"), 10 ** 400])
@pytest.mark.parametrize("class_mode", ["multiclass", "binary"])
def test_the_corrected_reading_never_coerces(value, class_mode):
    got = strict_label(value, class_mode)
    ok = (0, 1) if class_mode == "binary" else (0, 1, 2, 3, 4, 5)
    assert got is None or (type(value) is int and value in ok and got == value)
    official_label(value)                                             # the official reading never raises


def test_official_binary_label_seven_is_hateful_only_in_the_official_view():
    from lib.arcade.court import SampleResult
    r = SampleResult("a", 0, "000", "Easy", "track1", label=-1, status="unparseable", official_label=7, label_raw=7)
    assert evaluate([r], "binary", "official")["confusion"] == [[0, 1], [0, 0]]   # the official code: 7 > 0 -> 1
    assert evaluate([r], "binary", "corrected")["acc"] == 0.0 and evaluate([r], "binary", "corrected")["n"] == 1


@pytest.mark.parametrize("text,label", [
    ("This meme isn't hateful.", 0), ("This meme is not hateful.", 0), ("It is not at all hateful.", 0),
    ("This wasn't hateful in any way.", 0), ("There is nothing hateful here.", 0), ("It's not really hateful.", 0),
    ("The meme is non-hateful.", 0), ("The meme is hateful: it mocks the group.", 1),
    ("Clearly hateful toward the valley folk.", 1),
    ("It is hateful, or maybe not hateful.", None), ("I can't say it isn't hateful.", None),
    ("The image shows a dog.", None),
])
def test_the_lenient_parser_reads_negation_and_refuses_to_guess(text, label):
    a = parse_answer(text, parser="lenient")
    assert a.label == label and a.status == ("ok" if label is not None else "unparseable")


def test_loads_strict_refuses_what_json_loads_accepts():
    for bad in ('{"a": NaN}', '[Infinity]', '{"a": 1, "a": 1}', "1e400"):
        with pytest.raises(ValueError):
            loads_strict(bad)
    assert loads_strict('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}


#: answers with two readings: a repeated key (whatever the values, nested or not, fenced or in prose) or two
#: different JSON objects side by side (two verdicts)
TWO_READINGS = ['{"label": 0, "reason": "r", "label": 1}', '{"label": 1, "label": 1, "reason": "r"}',
                '{"label": 3, "reason": "r", "label": 2}', '```json\n{"label": 0, "reason": "r", "label": 4}\n```',
                'Verdict: {"label": 2, "reason": "x", "label": 2}', '{"label": 1, "reason": "r"} {"label": 3, "reason": "r"}',
                '{"label": 2, "reason": "r"}\n{"label": 5, "reason": "second thoughts"}',
                '```json\n{"label": 1, "reason": "r"}\n```\n```json\n{"label": 0, "reason": "r"}\n```']
#: one reading each (the same object twice is one reading)
ONE_READING = ['{"label": 2, "reason": "r"}', 'The verdict: {"label": 2, "reason": "a {braced} word"}',
               '{"label": 2, "reason": "r"} {"label": 2, "reason": "r"}', '```json\n{"label": 2, "reason": "r"}\n```',
               '{"label": 2, "nested": {"a": 1, "b": {"a": 2}}}']


class Scripted:
    """A backend answering every call with one text (the direct judge makes one call per post)."""
    native_schema = False

    def __init__(self, verdict):
        self.verdict = verdict

    def identity(self):
        return {"model": "scripted", "verdict": self.verdict}

    def complete(self, messages, params):
        return ChatResult(self.verdict, model="scripted")


@pytest.mark.parametrize("text", TWO_READINGS)
def test_two_readings_are_unparseable_for_every_reader(text):
    from lib.models.chat.structured import ambiguity, parse_structured
    assert ambiguity(text)
    with pytest.raises(ValueError):
        extract_json(text)
    parsed, why = parse_structured(text, GenParams(json_schema={"type": "object"}))
    assert parsed is None and why
    for parser in ("strict", "lenient"):                     # SEI: never the first or the last label
        assert parse_answer(text, parser=parser).status == "unparseable"


@pytest.mark.parametrize("text", ONE_READING)
def test_one_reading_is_read(text):
    from lib.models.chat.structured import ambiguity
    assert ambiguity(text) is None and extract_json(text)["label"] == 2


@pytest.mark.parametrize("parse", ["structured", "official"])
@pytest.mark.parametrize("text", TWO_READINGS[:5] + TWO_READINGS[5:7])
def test_a_verdict_with_two_readings_is_unparseable_in_the_corrected_view(tmp_path, parse, text):
    """The direct judge (both parse modes): the corrected view scores such a verdict as unparseable; the
    official view keeps the official code's reading (json-repair keeps one value)."""
    from dataclasses import dataclass, field
    from pathlib import Path

    @dataclass
    class Post:
        id: str
        text: str = "t"
        img_path: Path = Path("/nonexistent.png")
        label: int = 1
        meta: dict = field(default_factory=lambda: {"type": "011", "final_label_multiclass": 1})
    cfg = CourtConfig(run_mode="none", parse=parse, workers=1,
                      **({"debate_visibility": "official", "debater_failure": "pass_on"} if parse == "official" else {}))
    chat = Chat(Scripted(text), tmp_path / "c.sqlite")
    [r] = Court(chat, cfg).run_many([Post("p")], progress=False)
    assert r.status == "unparseable" and r.label == -1
    assert evaluate([r], "multiclass", "corrected")["acc"] == 0.0


@pytest.mark.parametrize("parse", ["structured", "official"])
@pytest.mark.parametrize("text", ONE_READING[:4])
def test_a_verdict_with_one_reading_is_scored(tmp_path, parse, text):
    """The control of the test above: the same court and backend read a single verdict as its label."""
    from dataclasses import dataclass, field
    from pathlib import Path

    @dataclass
    class Post:
        id: str
        text: str = "t"
        img_path: Path = Path("/nonexistent.png")
        label: int = 1
        meta: dict = field(default_factory=lambda: {"type": "011", "final_label_multiclass": 2})
    cfg = CourtConfig(run_mode="none", parse=parse, workers=1,
                      **({"debate_visibility": "official", "debater_failure": "pass_on"} if parse == "official" else {}))
    [r] = Court(Chat(Scripted(text), tmp_path / "c.sqlite"), cfg).run_many([Post("p")], progress=False)
    assert (r.status, r.label) == ("ok", 2) and evaluate([r], "multiclass", "corrected")["acc"] == 1.0
