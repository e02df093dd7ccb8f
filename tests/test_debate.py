"""ARCADE's court driven by a scripted chat backend through every route (Track I, Track II with K
rounds, summary dismissal, refusals at each stage, unparseable output, a failed call that succeeds
on retry), both debate visibilities; the official balanced sampler; the evaluator against
hand-computed reports for both views."""
import json
import random
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lib.models.chat import Chat, ChatResult, OpenAICompatibleBackend
from lib.arcade.court import Court, CourtConfig, CourtError, Prompts, SampleResult, official_parse
from lib.arcade.scoring import balanced_sample, evaluate, report_text

CUE = {"id": 1, "cue_type": "Direct", "target_group": "valley folk", "claim": "CLAIM-P1", "hate_type": 1,
       "justification": "J"}
IND = {"id": 1, "cue_type": "Metaphor", "target_group": "valley folk", "claim": "CLAIM-IND", "hate_type": 5,
       "justification": "J"}
R2 = {"id": 1, "cue_type": "Metaphor", "target_group": "valley folk", "hate_type": 5, "counter_argument": "COUNTER"}
REB = {"id": 1, "evidence": "EVIDENCE", "rebuttal": "REBUTTAL-D1"}


@dataclass
class Sample:
    id: str = "s1"
    text: str = "the valley folk are here"
    img_path: Path = Path("/nonexistent.png")
    label: int = 1
    meta: dict = field(default_factory=lambda: {"type": "001", "final_label_multiclass": 5})


def default_answers(**over):
    a = {"rapid_scan": {"cues": [CUE]}, "prosecutor": {"cues": [CUE]}, "defender": {"rebuttals": [REB]},
         "judge": {"label": 1, "label_str": "Racist", "reason": "r"},
         "prosecutor_indirect": {"cues": [IND]}, "defender_indirect": {"rebuttals": [REB]},
         "prosecutor_round2": {"cues": [R2]}, "defender_round2": {"rebuttals": [{"id": 1, "rebuttal": "REBUTTAL-R2"}]},
         "judge_indirect": {"label": 5, "label_str": "OtherHate", "reason": "r"},
         "baseline": {"label": 0, "reason": "r"}}
    a.update(over)
    return a


class CourtScript:
    """A chat backend answering per stage (recognised by the stage's system prompt)."""
    native_schema = True

    def __init__(self, prompts: Prompts, answers: dict):
        self.by_system = {prompts.system(s).text: s for s in prompts._system if s != "baseline"}
        self.baseline_text = prompts.system("baseline").text
        self.answers = answers
        self.calls = []
        self.lock = threading.Lock()

    def identity(self):
        return {"model": "court-script"}

    def stage_of(self, messages):
        sys_text = messages[0]["content"][0]["text"]
        if sys_text == "":
            assert messages[1]["content"][0]["text"].startswith(self.baseline_text)
            return "baseline"
        return self.by_system[sys_text]

    def complete(self, messages, params):
        stage = self.stage_of(messages)
        user_text = "".join(p["text"] for p in messages[1]["content"] if p["type"] == "text")
        with self.lock:
            self.calls.append((stage, params.temperature, user_text))
        a = self.answers[stage]
        if isinstance(a, ChatResult):
            return a
        return ChatResult(a if isinstance(a, str) else json.dumps(a), model="court-script")


def make(answers=None, **cfg):
    c = CourtConfig(**cfg)
    script = CourtScript(Prompts(c), answers or default_answers())
    return Court(Chat(script, None), c), script


def test_track_one_when_the_rapid_scan_finds_cues():
    court, script = make()
    r = court.run(Sample())
    assert [c[0] for c in script.calls] == ["rapid_scan", "prosecutor", "defender", "judge"]
    assert [c[1] for c in script.calls] == [0.0, 0.8, 0.8, 0.1]
    assert r.route == "track1" and r.label == 1 and r.status == "ok" and not r.official_refusal
    assert "CLAIM-P1" in script.calls[2][2]                            # the defender answers the accusations
    assert "CLAIM-P1" in script.calls[3][2] and "REBUTTAL-D1" in script.calls[3][2]
    assert [c.stage for c in r.calls] == ["rapid_scan", "prosecutor", "defender", "judge"]
    assert all(c.template and c.status == "ok" for c in r.calls)


@pytest.mark.parametrize("visibility", ["transcript", "official"])
def test_track_two_runs_k_rounds_and_the_judge_reads_the_transcript(visibility):
    court, script = make(default_answers(rapid_scan={"cues": []}), rounds=3, debate_visibility=visibility)
    r = court.run(Sample())
    stages = [c[0] for c in script.calls]
    assert stages == ["rapid_scan", "prosecutor_indirect", "defender_indirect", "prosecutor_round2", "defender_round2",
                      "prosecutor_round2", "defender_round2", "judge_indirect"]
    assert [c[1] for c in script.calls] == [0.0] + [0.7] * 6 + [0.1]
    assert r.route == "track2" and r.label == 5 and len(r.transcript) == 3
    seen = {i: script.calls[i][2] for i in range(len(script.calls))}
    judge = seen[7]
    assert "CLAIM-IND" in judge and "REBUTTAL-D1" in judge and "COUNTER" in judge and "REBUTTAL-R2" in judge
    if visibility == "transcript":
        assert "CLAIM-IND" in seen[2]                                   # round-1 defender sees the accusations
        assert "REBUTTAL-D1" in seen[3] and "COUNTER" not in seen[3]    # round-2 prosecutor sees round 1
        assert "COUNTER" in seen[4]                                     # round-2 defender sees round 2's accusations
    else:                                                               # the official code's blind debaters
        for i in range(1, 7):
            assert "CLAIM-IND" not in seen[i] and "REBUTTAL" not in seen[i] and "COUNTER" not in seen[i]


def test_without_the_gate_every_sample_goes_through_track_two():
    court, script = make(gate=False, rounds=2)
    r = court.run(Sample())
    assert [c[0] for c in script.calls] == ["prosecutor_indirect", "defender_indirect", "prosecutor_round2",
                                            "defender_round2", "judge_indirect"]
    assert r.route == "track2" and r.label == 5
    from lib.arcade.scoring import cost_summary
    assert cost_summary([r], 2)["calls_all_track2"] == 5 and cost_summary([r], 2)["gate_call_saving"] == 0.0


def test_summary_dismissal_when_the_first_indirect_prosecutor_finds_nothing():
    court, script = make(default_answers(rapid_scan={"cues": []}, prosecutor_indirect={"cues": []}))
    r = court.run(Sample())
    assert [c[0] for c in script.calls] == ["rapid_scan", "prosecutor_indirect"]
    assert r.route == "dismissal" and r.label == 0 and r.reason == "No cues found."


TRACK1 = ["rapid_scan", "prosecutor", "defender", "judge"]
TRACK2 = ["rapid_scan", "prosecutor_indirect", "defender_indirect", "prosecutor_round2", "defender_round2",
          "judge_indirect"]


@pytest.mark.parametrize("status", ["refused", "blocked"])
@pytest.mark.parametrize("route,stage", [("t1", s) for s in TRACK1] + [("t2", s) for s in TRACK2[1:]])
def test_a_refusal_at_any_stage_ends_the_trial_and_is_reported_by_cause(route, stage, status):
    answers = default_answers(**({} if route == "t1" else {"rapid_scan": {"cues": []}}))
    answers[stage] = ChatResult("", status, error=f"{status} by the provider", model="court-script")
    court, script = make(answers, rounds=2)
    r = court.run(Sample())
    order = TRACK1 if route == "t1" else TRACK2
    assert [c[0] for c in script.calls] == order[:order.index(stage) + 1]
    assert r.status == status and r.cause == stage and r.label == -1 and r.official_refusal
    assert r.calls[-1].status == status


def test_unparseable_answers():
    # a judge that does not give a verdict: wrong in both views, not a refusal
    court, _ = make(default_answers(judge="the post seems fine"))
    r = court.run(Sample())
    assert r.status == "unparseable" and r.cause == "judge" and r.label == -1 and not r.official_refusal
    # a rapid scan that cannot be read: the official gate's "Stage A Failed" (a refusal)
    court, script = make(default_answers(rapid_scan="no idea"))
    r = court.run(Sample())
    assert r.route == "error" and r.status == "unparseable" and r.official_refusal and len(script.calls) == 1
    # a debater's unreadable answer leaves the debate going with nothing from that side
    court, script = make(default_answers(defender="???"))
    r = court.run(Sample())
    assert r.status == "ok" and r.label == 1 and r.calls[2].status == "unparseable"


def test_a_cut_off_structured_answer_is_recovered_by_the_json_repair_fallback():
    cut = '{"cues": [{"id": 1, "cue_type": "Direct", "target_group": "valley folk", "claim": "CLAIM-P1", ' \
          '"hate_type": 1, "justification": "J'
    court, script = make(default_answers(rapid_scan=cut))
    r = court.run(Sample())
    assert r.route == "track1" and r.calls[0].status == "ok" and r.calls[0].repaired
    assert r.calls[0].output[0]["claim"] == "CLAIM-P1"
    # without the fallback, the gate fails as the official one does
    court, script = make(default_answers(rapid_scan=cut), repair_fallback=False)
    assert court.run(Sample()).route == "error"
    # a repaired value that does not fit the schema is not kept
    court, script = make(default_answers(judge='{"label": "racist", "reason": "r"'))
    r = court.run(Sample())
    assert r.status == "unparseable" and not r.calls[-1].repaired


def test_the_direct_baseline_is_one_call_with_the_official_layout():
    court, script = make(run_mode="none")
    r = court.run(Sample())
    assert [c[:2] for c in script.calls] == [("baseline", 0.8)]
    assert r.route == "baseline" and r.label == 0 and len(r.calls) == 1


def test_official_parse_reads_free_text_leniently():
    court, script = make(default_answers(
        rapid_scan="Sure.\n```json\n[]\n```", prosecutor_indirect="I found: []",
        judge="```json\n{\"label\": 3}\n```"), parse="official")
    r = court.run(Sample())
    assert r.route == "dismissal" and r.label == 0
    assert official_parse('```json\n{"a": 1}\n```\ntext\n```json\n[2]\n```') == [2]     # the last fenced block
    assert official_parse("I cannot judge this post.")["error"] == "Output format is not JSON"


class RetryServer:
    """An OpenAI-compatible server answering per stage; the first defender request gets a 503."""

    def __init__(self, script: CourtScript):
        self.script, self.attempts = script, {}
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                msgs = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]
                         if isinstance(m["content"], str) else m["content"]} for m in body["messages"]]
                stage = srv.script.stage_of(msgs)
                n = srv.attempts[stage] = srv.attempts.get(stage, 0) + 1
                if stage == "defender" and n == 1:
                    out, code = b'{"error": "overloaded"}', 503
                else:
                    ans = srv.script.answers[stage]
                    out, code = json.dumps({"choices": [{"message": {"role": "assistant", "content": json.dumps(ans)},
                                                         "finish_reason": "stop"}],
                                            "usage": {"prompt_tokens": 5, "completion_tokens": 5}}).encode(), 200
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_a_failed_call_that_succeeds_on_retry_is_not_a_refusal(tmp_path):
    cfg = CourtConfig()
    script = CourtScript(Prompts(cfg), default_answers())
    srv = RetryServer(script)
    try:
        backend = OpenAICompatibleBackend("m", srv.url, api_key_optional=True, backoff_s=0.01, max_retries=2)
        chat = Chat(backend, tmp_path / "c.sqlite")
        r = Court(chat, cfg).run(Sample())
        assert r.status == "ok" and r.label == 1 and srv.attempts["defender"] == 2
        assert [c.status for c in r.calls] == ["ok"] * 4
        # a rerun replays every stage from the cache: zero requests
        before = sum(srv.attempts.values())
        again = Court(Chat(OpenAICompatibleBackend("m", srv.url, api_key_optional=True), tmp_path / "c.sqlite"), cfg)
        r2 = again.run(Sample())
        assert sum(srv.attempts.values()) == before and again.chat.stats.requests == 0
        assert r2.label == r.label and all(c.from_cache for c in r2.calls)
    finally:
        srv.httpd.shutdown()


def test_many_samples_run_concurrently_in_input_order():
    court, script = make(workers=4)
    samples = [Sample(id=f"s{i}", text=f"text {i}") for i in range(12)]
    res = court.run_many(samples, progress=False)
    assert [r.id for r in res] == [s.id for s in samples] and len(script.calls) == 48


def test_prompts_can_come_from_an_official_checkout(tmp_path):
    consts = {"PROSECUTOR_DIRECT_PROMPT": "scan {x}", "PROSECUTOR_PROMPT": "P", "DEFENDER_PROMPT": "D",
              "JUDGE_PROMPT": "J", "PROSECUTOR_INDIRECT_PROMPT": "PI", "DEFENDER_INDIRECT_PROMPT": "DI",
              "PROSECUTOR_ROUND_2_PROMPT": "P2", "DEFENSE_ROUND_2_PROMPT": "D2", "JUDGE_PROMPT_INDIRECT": "JI",
              "SAFETY_PROMPT": "S"}
    (tmp_path / "court_prompts.py").write_text("".join(f"{k} = {v!r}\n" for k, v in consts.items()))
    p = Prompts(CourtConfig(official_prompts_repo=str(tmp_path)))
    assert p.system("rapid_scan").text == "scan {x}" and p.system("rapid_scan").id.startswith("official:")
    with pytest.raises(CourtError, match="court_prompts_binary.py"):
        Prompts(CourtConfig(official_prompts_repo=str(tmp_path), class_mode="binary"))
    with pytest.raises(CourtError, match="debate_visibility"):
        CourtConfig(debate_visibility="open")
    with pytest.raises(CourtError, match="unknown stage"):
        CourtConfig(temperatures={"jury": 0.1})


def test_every_stage_has_a_prompt_and_a_schema_in_both_class_modes():
    from lib.arcade.court import STAGES
    for mode in ("multiclass", "binary"):
        p = Prompts(CourtConfig(class_mode=mode))
        for s in STAGES:
            assert p.system(s).text.strip() and p.schema(s)["type"] == "object"
            assert "{definition}" not in p.system(s).text
        assert p.schema("judge")["properties"]["label"]["maximum"] == (5 if mode == "multiclass" else 1)


# ----------------------------------------------------------------------------- sampler
def _official_reference(items, n, seed):
    """The official algorithm as the spec states it, with the global `random`."""
    if n == 0 or n >= len(items):
        return [i for i, _ in items]
    random.seed(seed)
    groups = {}
    for it in items:
        groups.setdefault(it[1], []).append(it)
    quota = n // len(groups)
    sel, pool = [], []
    for t in groups:
        random.shuffle(groups[t])
        sel += groups[t][:min(len(groups[t]), quota)]
        pool += groups[t][min(len(groups[t]), quota):]
    if n - len(sel) > 0:
        sel += random.sample(pool, n - len(sel))
    random.shuffle(sel)
    return [i for i, _ in sel]


def test_balanced_sampler_matches_the_official_algorithm():
    sizes = {"000": 40, "001": 3, "010": 12, "011": 2, "100": 9, "101": 11, "110": 4, "111": 20}
    rng = random.Random(1)
    items = [(f"{i:05d}", t) for i, t in enumerate(rng.sample([t for t, k in sizes.items() for _ in range(k)],
                                                             sum(sizes.values())))]
    state = random.getstate()
    for n, seed in ((24, 2024), (40, 2024), (40, 7), (0, 2024), (500, 2024)):
        got = balanced_sample(items, n, seed)
        assert got == _official_reference(items, n, seed)
        assert len(got) == (len(items) if n in (0, 500) else n) and len(set(got)) == len(got)
    random.setstate(state)
    got = balanced_sample(items, 24, 2024)
    types = {i: t for i, t in items}
    counts = {t: sum(types[i] == t for i in got) for t in sizes}
    assert counts["011"] == 2 and counts["001"] == 3 and min(counts[t] for t in ("000", "010", "111")) >= 3
    assert random.getstate() == state                  # the caller's global generator is left alone
    assert balanced_sample(items, 0, 1) == [i for i, _ in items]


def test_balanced_sampler_on_an_h_vli_fixture_file(tmp_path):
    """The sampler over records read from a file in the official format (dict keyed by id, lower-case
    difficulty), as notebook 05 calls it."""
    from lib.data.datasets import load
    rng = random.Random(5)
    data = {}
    for i in range(60):
        t = rng.choice(["000", "000", "001", "010", "011", "100", "101", "110", "111"])
        lab = {"text_label": int(t[0]) * 2, "image_label": int(t[1]), "final_label": int(t[2]) * 5}
        data[f"{i:05d}"] = {"tweet_text": f"post {i}", "image_path": f"img/{i}.jpg", **lab,
                            "text_label_str": "", "image_label_str": "", "final_label_str": "", "type": t,
                            "difficulty": {"000": "easy", "011": "easy", "101": "easy", "111": "easy", "100": "normal",
                                           "010": "normal", "001": "hard", "110": "hard"}[t]}
    (tmp_path / "test_set.json").write_text(json.dumps(data))
    (tmp_path / "train_set.json").write_text("{}")
    recs = [r for r in load("hvli", tmp_path, check_images="none", splits=["test"]).records]
    items = [(r.id, r.meta["type"]) for r in recs]
    assert [i for i, _ in items] == list(data)                       # file order kept
    got = balanced_sample(items, 16, 2024)
    assert got == _official_reference(items, 16, 2024) and len(set(got)) == 16


# ----------------------------------------------------------------------------- evaluator
def _r(i, gt, typ, label, status="ok", refused=False, cause=None):
    diff = {"000": "Easy", "011": "Easy", "101": "Easy", "111": "Easy", "100": "Normal", "010": "Normal",
            "001": "Hard", "110": "Hard"}[typ]
    return SampleResult(f"s{i}", gt, typ, diff, "track1", label=label, status=status, official_refusal=refused,
                        cause=cause)


HAND = [_r(1, 0, "000", 0), _r(2, 1, "001", 1), _r(3, 2, "111", 1),
        _r(4, 0, "100", -1, "refused", True, "judge"), _r(5, 0, "110", -1, "unparseable", False, "judge"),
        _r(6, 4, "011", 0)]


def test_evaluator_official_view_by_hand():
    ev = evaluate(HAND, "multiclass", "official")
    assert ev["n"] == 5 and ev["n_refused"] == 1
    assert ev["acc"] == pytest.approx(2 / 5) and ev["acc_easy"] == pytest.approx(1 / 3)
    assert ev["acc_hard"] == pytest.approx(1 / 2) and ev["n_normal"] == 0
    assert ev["binary_acc"] == pytest.approx(3 / 5)
    # -1 forced to the wrong class (1 for a gt of 0); F1 over the labels present {0, 1, 2, 4}
    assert ev["macro_f1"] == pytest.approx((0.5 + 0.5 + 0 + 0) / 4)
    assert ev["weighted_f1"] == pytest.approx((0.5 * 2 + 0.5 * 1) / 5)
    b = evaluate(HAND, "binary", "official")
    assert b["acc"] == pytest.approx(3 / 5)
    assert b["f1_positive"] == pytest.approx(2 / 3) and b["precision_positive"] == pytest.approx(2 / 3)
    assert b["confusion"] == [[1, 1], [1, 2]]


def test_evaluator_corrected_view_by_hand():
    ev = evaluate(HAND, "multiclass", "corrected")
    assert ev["n"] == 6 and ev["n_refused"] == 0
    assert ev["acc"] == pytest.approx(2 / 6) and ev["acc_normal"] == 0.0 and ev["n_normal"] == 1
    assert ev["not_ok_by_cause"] == {"refused:judge": 1, "unparseable:judge": 1}
    # six classes always: 0 (tp 1, fp 1, fn 2: F1 0.4), 1 (tp 1, fp 3: 1/3... ) checked against sklearn
    from sklearn.metrics import f1_score
    y = [0, 1, 2, 0, 0, 4]
    p = [0, 1, 1, 1, 1, 0]
    assert ev["macro_f1"] == pytest.approx(f1_score(y, p, average="macro", labels=[0, 1, 2, 3, 4, 5], zero_division=0))
    b = evaluate(HAND, "binary", "corrected")
    assert b["acc"] == pytest.approx(3 / 6) and "macro_f1" in b and "f1_positive" in b


def test_report_txt_has_the_official_layout():
    txt = report_text(HAND, "multiclass", "ARCADE", "m")
    assert txt.startswith("Report: [ARCADE] - Model: m (Mode: multiclass)")
    assert "Safety Refused: 1 samples (Excluded from stats)" in txt
    assert "Strict Accuracy: 40.00%" in txt and "Binary Accuracy: 60.00%" in txt
    assert "[Breakdown by Difficulty]" in txt and "Normal + Hard" in txt and "[Breakdown by Type]" in txt
    row = json.loads(txt.strip().splitlines()[-1].replace("nan", "NaN"))
    assert row[3] == 40.0 and row[6] == 1 and row[7] == pytest.approx(100 / 6, abs=0.01)


def test_world_knowledge_follows_the_definition_in_every_system_prompt(tmp_path):
    """The embedded court is told who MemeWorld's peoples are and which category each belongs to;
    without the setting (the paper profile, the official code) the definition stands alone."""
    from lib import ROOT
    from lib.data.memeworld import GROUPS, HVLI_LABEL_STR
    plain = Prompts(CourtConfig())
    cfg = CourtConfig(world_knowledge="params/prompts/arcade/world/memeworld.txt")
    world = Prompts(cfg)
    text = (ROOT / cfg.world_knowledge).read_text()
    for stage in ("rapid_scan", "prosecutor", "judge", "baseline"):
        assert "Zorblins" in world.system(stage).text and "Zorblins" not in plain.system(stage).text
        assert world.system(stage).text.startswith(plain.system(stage).text.split("Hate categories")[0])
    # the file agrees with the generator: every people, its sigil and its category (the H-VLI code and word)
    words = {1: "racist", 2: "sexist", 3: "homophobic", 4: "religious", 5: "other hate"}
    for plural, _, cat, symbol in GROUPS.values():
        line = next(x for x in text.splitlines() if x.startswith(f"- {plural} "))
        assert f"({symbol} sigil): category {cat}, {words[cat]}" in line, (line, HVLI_LABEL_STR[cat])
    with pytest.raises(CourtError, match="does not exist"):
        Prompts(CourtConfig(world_knowledge=str(tmp_path / "missing.txt")))


def test_definition_first_layout_opens_every_role_with_one_shared_prefix(tmp_path):
    """prompt_layout definition_first: the same definition and world knowledge open every role's
    system prompt (one prefix the server's prompt cache reuses across roles); the role's own lines
    follow unchanged. role_first (the default, the official layout) is the prompt files as written."""
    from lib.arcade.court import STAGES
    wk = "params/prompts/arcade/world/memeworld.txt"
    first = Prompts(CourtConfig(prompt_layout="definition_first", world_knowledge=wk))
    roles = Prompts(CourtConfig(world_knowledge=wk))
    shared = first.system("rapid_scan").text.split("\nYou are", 1)[0]
    assert "Zorblins" in shared and len(shared) > 500
    for s in STAGES:
        a, b = first.system(s).text, roles.system(s).text
        assert sorted(a.splitlines()) == sorted(b.splitlines())          # the same lines, rearranged
        if s != "baseline" and not a == b:
            assert a.startswith(shared) and not b.startswith(shared)
        assert a.startswith(shared) or "Zorblins" not in b                # every prompt with the definition shares it
        assert first.system(s).id != roles.system(s).id or a == b
    # the official prompts are used as written
    consts = {c: c for c in ("PROSECUTOR_DIRECT_PROMPT", "PROSECUTOR_PROMPT", "DEFENDER_PROMPT", "JUDGE_PROMPT",
                             "PROSECUTOR_INDIRECT_PROMPT", "DEFENDER_INDIRECT_PROMPT", "PROSECUTOR_ROUND_2_PROMPT",
                             "DEFENSE_ROUND_2_PROMPT", "JUDGE_PROMPT_INDIRECT", "SAFETY_PROMPT")}
    (tmp_path / "court_prompts.py").write_text("".join(f"{k} = {v!r}\n" for k, v in consts.items()))
    with pytest.raises(CourtError, match="role_first"):
        Prompts(CourtConfig(official_prompts_repo=str(tmp_path), prompt_layout="definition_first"))
    with pytest.raises(CourtError, match="prompt_layout"):
        CourtConfig(prompt_layout="middle")
