"""`CourtConfig.official()` behaves as the official ARCADE code on the same answers.

`official_trial` below restates the official control flow from the reference's reading of it
(court_system.py, main.py, evaluator.py): which calls are made in which order, at which
temperature, what JSON of the other side each call carries, how failures of each stage end or
do not end the trial, and how the verdict is read. Each scenario scripts raw answers per stage
(free text, or a refused / blocked / failed request) and compares the court's calls, what each
shows the model, the final label and the refusal status with the restatement's.
"""
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lib.models.chat import Chat, ChatResult
from lib.arcade.court import (DEFAULT_TEMPERATURES, EMPTY_RESPONSE, MISSING_IMAGE, ROLE, Court, CourtConfig, Prompts,
                              official_label, official_parse)
from lib.arcade.scoring import evaluate

CUE = {"id": 1, "cue_type": "Direct", "target_group": "valley folk", "claim": "CLAIM-P1", "hate_type": 1,
       "justification": "J"}
IND = {"id": 1, "cue_type": "Metaphor", "target_group": "valley folk", "claim": "CLAIM-IND", "hate_type": 5,
       "justification": "J"}
REB = {"id": 1, "evidence": "E", "rebuttal": "REB"}
J = json.dumps


def fail(status):
    return ChatResult("", status, error=f"{status} by the provider", model="script")


@dataclass
class Post:
    id: str = "p1"
    text: str = "the valley folk are here"
    img_path: Path = Path("/nonexistent/post.png")
    label: int = 1
    meta: dict = field(default_factory=lambda: {"type": "001", "final_label_multiclass": 5})


class Script:
    """Answers per stage, in call order (a list per stage); records every call's messages."""
    native_schema = False

    def __init__(self, prompts: Prompts, answers: dict):
        self.by_system = {prompts.system(s).text: s for s in prompts._system if s != "baseline"}
        self.answers = {k: list(v) if isinstance(v, list) else [v] for k, v in answers.items()}
        self.calls = []
        self.lock = threading.Lock()

    def identity(self):
        return {"model": "official-script"}

    def complete(self, messages, params):
        sys_text = messages[0]["content"][0]["text"]
        stage = "baseline" if sys_text == "" else self.by_system[sys_text]
        with self.lock:
            self.calls.append((stage, params.temperature, messages[1]["content"]))
        queue = self.answers[stage]
        a = queue.pop(0) if len(queue) > 1 else queue[0]
        return a if isinstance(a, ChatResult) else ChatResult(a, model="official-script")


# ----------------------------------------------------------------------------- the official flow, restated
def official_trial(answers: dict, rounds: int = 3, baseline: bool = False):
    """[(stage, role, temperature, [JSON shown])], label, refused: as the official code would give them."""
    queues = {k: list(v) if isinstance(v, list) else [v] for k, v in answers.items()}
    calls = []

    def call(stage, shown):
        calls.append((stage, ROLE[stage], DEFAULT_TEMPERATURES[stage], shown))
        q = queues[stage]
        a = q.pop(0) if len(q) > 1 else q[0]
        if isinstance(a, ChatResult):           # the client's refusal dict for a refused / rejected / failed request
            return {"refusal": True, "error": a.error}
        return official_parse(a)

    def failed(v):
        return isinstance(v, dict) and (v.get("refusal") or "error" in v)

    def verdict(v):
        if not isinstance(v, dict):
            v = {"label": -1, "error": "Judge output not dict"}
        if v.get("refusal") is True:
            return -1, True
        return official_label(v.get("label")), False

    if baseline:
        v = call("baseline", [])
        return calls, *verdict(v if isinstance(v, dict) else {"label": v})
    scan = call("rapid_scan", [])
    if failed(scan):
        return calls, -1, True                   # Stage A Failed
    if isinstance(scan, list) and scan:
        p = call("prosecutor", [])
        d = call("defender", [J(p)])             # a failed prosecutor is passed on as it is
        return calls, *verdict(call("judge", [J(p), J(d)]))
    history = []
    for r in range(rounds):
        p = call("prosecutor_indirect" if r == 0 else "prosecutor_round2", [])
        if r == 0 and isinstance(p, list) and not p:
            return calls, 0, False               # summary dismissal
        d = call("defender_indirect" if r == 0 else "defender_round2", [])
        history.append({"round": r + 1, "prosecutor": p, "defense": d})
    return calls, *verdict(call("judge_indirect", [J(history)]))


def good(**over):
    a = {"rapid_scan": J([CUE]), "prosecutor": J([CUE]), "defender": J([REB]),
         "judge": J({"label": 1, "label_str": "Racist", "reason": "r"}),
         "prosecutor_indirect": J([IND]), "defender_indirect": J([REB]), "prosecutor_round2": J([IND]),
         "defender_round2": J([REB]), "judge_indirect": J({"label": 5, "label_str": "OtherHate", "reason": "r"}),
         "baseline": J({"label": 0, "reason": "r"})}
    a.update(over)
    return a


T2 = {"rapid_scan": "[]"}
SCENARIOS = {
    "track1": good(),
    "track1 prosecutor refused": good(prosecutor=fail("refused")),
    "track1 prosecutor blocked": good(prosecutor=fail("blocked")),
    "track1 defender failed": good(defender=fail("failed")),
    "track1 prosecutor says null": good(prosecutor="null"),
    "track1 prosecutor says 0": good(prosecutor="0"),
    "track1 defender writes prose": good(defender="I would rather not rebut this."),
    "track1 defender writes a refusal object": good(defender=J({"refusal": True, "error": "no"})),
    "track1 judge refused": good(judge=fail("refused")),
    "track1 judge says 4": good(judge="4"),
    "track1 judge says true": good(judge="true"),
    "track1 judge in a JSON fence, upper case": good(judge='Verdict:\n```JSON\n{"label": 2}\n```'),
    "track1 judge in a bare fence": good(judge='```\n{"label": 3}\n```'),
    "track1 judge, the last of two fences": good(judge='```json\n{"label": 1}\n```\n```json\n{"label": 4}\n```'),
    "track1 judge gives a list": good(judge='[{"label": 1}]'),
    "track1 judge gives a label name": good(judge=J({"label": "Sexist"})),
    "track1 judge gives label 7": good(judge=J({"label": 7})),
    "track1 judge gives label 1.9": good(judge=J({"label": 1.9})),
    "track1 judge writes prose": good(judge="The post is fine."),
    "track1 judge label with an error key": good(judge=J({"label": 2, "error": "x"})),
    "rapid scan refused": good(rapid_scan=fail("refused")),
    "rapid scan says 1": good(rapid_scan="1"),
    "rapid scan says null": good(rapid_scan="null"),
    "rapid scan writes prose": good(rapid_scan="Nothing explicit here."),
    "rapid scan gives one cue unwrapped": good(rapid_scan=J(CUE)),
    "track2": good(**T2),
    "track2 dismissal": good(**T2, prosecutor_indirect="[]"),
    "track2 dismissal in a fence": good(**T2, prosecutor_indirect="No cues.\n```json\n[]\n```"),
    "track2 round-1 prosecutor refused": good(**T2, prosecutor_indirect=fail("refused")),
    "track2 round-1 prosecutor says 0": good(**T2, prosecutor_indirect="0"),
    "track2 round-2 prosecutor blocked": good(**T2, prosecutor_round2=[fail("blocked"), J([IND])]),
    "track2 defenders refused": good(**T2, defender_indirect=fail("refused"), defender_round2=fail("refused")),
    "track2 round-3 defender says null": good(**T2, defender_round2=[J([REB]), "null"]),
    "track2 judge refused": good(**T2, judge_indirect=fail("blocked")),
    "track2 judge says 0": good(**T2, judge_indirect="0"),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("with_image", [False, True])
def test_the_official_settings_follow_the_official_code(name, with_image, tmp_path):
    answers = SCENARIOS[name]
    cfg = CourtConfig.official(rounds=3)
    script = Script(Prompts(cfg), answers)
    post = Post()
    if with_image:
        from PIL import Image
        post.img_path = tmp_path / "post.png"
        Image.new("RGB", (8, 8), "red").save(post.img_path)
    r = Court(Chat(script, None), cfg).run(post)
    want_calls, want_label, want_refused = official_trial(answers, rounds=3)
    # the same calls, in order, each stage with its role and temperature
    assert [(s, ROLE[s], t) for s, t, _ in script.calls] == [c[:3] for c in want_calls]
    assert [(c.stage, c.role, c.temperature) for c in r.calls] == [c[:3] for c in want_calls]
    for (stage, _, parts), (_, _, _, shown) in zip(script.calls, want_calls):
        user_text = "".join(p["text"] for p in parts if p["type"] == "text")
        for payload in shown:                       # the other side's JSON, exactly as the official code writes it
            assert payload in user_text, (stage, payload)
        if stage.endswith(("_indirect", "_round2")) and not stage.startswith("judge"):
            assert "CLAIM" not in user_text and "REB" not in user_text      # blind debaters
        # the post's image, or the official placeholder where its file is absent
        images = [p for p in parts if p["type"] != "text"]
        placeholders = [p for p in parts if p["type"] == "text" and p["text"] == MISSING_IMAGE]
        assert (len(images), len(placeholders)) == ((1, 0) if with_image else (0, 1)), stage
    assert (r.official_label, r.official_refusal) == (want_label, want_refused)
    ev = evaluate([r], "multiclass", "official")
    assert ev["n_refused"] == int(want_refused) and ev["n"] == int(not want_refused)


@pytest.mark.parametrize("answer", [J({"label": 0, "reason": "r"}), "4", "null", '[{"label": 1}]', "prose",
                                    '```JSON\n{"label": 5}\n```', fail("refused"), J({"label": 7})])
def test_the_official_direct_baseline(answer):
    cfg = CourtConfig.official(run_mode="none")
    script = Script(Prompts(cfg), {"baseline": answer})
    r = Court(Chat(script, None), cfg).run(Post())
    want_calls, want_label, want_refused = official_trial({"baseline": answer}, baseline=True)
    assert [(s, t) for s, t, _ in script.calls] == [(c[0], c[2]) for c in want_calls] == [("baseline", 0.8)]
    assert (r.official_label, r.official_refusal) == (want_label, want_refused)


def test_a_failed_debater_is_passed_on_officially_and_stops_the_trial_as_the_compendiums_option():
    answers = good(prosecutor=fail("refused"))
    official = Court(Chat(Script(Prompts(CourtConfig.official()), answers), None), CourtConfig.official())
    r = official.run(Post())
    assert r.route == "track1" and r.status == "ok" and r.label == 1 and not r.official_refusal
    assert r.passed_on == ["prosecutor"] and r.calls[1].status == "refused"
    assert r.transcript[0]["prosecutor"] == {"error": "refused by the provider", "refusal": True}
    stop = CourtConfig.official(debater_failure="stop")
    r = Court(Chat(Script(Prompts(stop), answers), None), stop).run(Post())
    assert r.status == "refused" and r.cause == "prosecutor" and r.official_refusal and len(r.calls) == 2


@pytest.mark.parametrize("raw,expected", [
    ('```JSON\n{"a": 1}\n```', {"a": 1}),
    ('```Json\n[1]\n```', [1]),
    ('text\n```\n{"b": 2}\n```', {"b": 2}),
    ('```json\n{"a": 1}\n```\n```\n[3]\n```', [3]),
    ("0", EMPTY_RESPONSE), ("4", EMPTY_RESPONSE), ("true", EMPTY_RESPONSE), ("null", EMPTY_RESPONSE),
    ("```json\n7\n```", EMPTY_RESPONSE), (None, EMPTY_RESPONSE),
    ('{"label": 2}', {"label": 2}), ("[]", []),
])
def test_official_parse_reads_fences_of_any_case_and_refuses_bare_values(raw, expected):
    assert official_parse(raw) == expected


def test_official_parse_turns_a_string_into_a_not_json_error():
    v = official_parse("I cannot judge this post.")
    assert v["error"] == "Output format is not JSON" and v["refusal"] is False


def test_the_official_and_corrected_label_readings_differ_only_as_documented():
    cfg = CourtConfig.official()
    for raw, official, corrected in [(J({"label": 7}), 7, -1), (J({"label": 1.9}), 1, -1),
                                     (J({"label": True}), 1, -1), (J({"label": "1"}), 1, -1),
                                     (J({"label": 3}), 3, 3), (J({"label": "Sexist"}), -1, -1)]:
        r = Court(Chat(Script(Prompts(cfg), good(judge=raw)), None), cfg).run(Post())
        assert (r.official_label, r.label) == (official, corrected), raw
        assert r.status == ("ok" if corrected >= 0 else "unparseable")
