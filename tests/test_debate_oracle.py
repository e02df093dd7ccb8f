"""Oracle debaters (the court's positive control): the prosecutor and defender say the generator's account, only
the judge is asked, every oracle answer fits its stage's schema; and the control arm at the paper's effect."""
import json

import jsonschema
import pytest

from lib.arcade.court import CourtConfig, CourtError, Prompts
from lib.arcade.oracle import OracleCourt, accounts_from_memeworld, oracle_cues, oracle_rebuttals
from lib.data.records import MemeRecord
from lib.models.chat import ChatResult

HATEFUL = {"id": 7, "group": "quaxi", "final_category": 1, "text_category": 0, "image_category": 0,
           "text_reason": "points at the Quaxi", "image_reason": "a symbol the Quaxi are mocked with",
           "final_reason": "the text names the Quaxi and the picture mocks them: together an attack " * 3}
ONE_SIDED = {**HATEFUL, "id": 8, "final_category": 0, "text_category": 2, "text_reason": "text alone insults them",
             "final_reason": "the picture makes the text a joke about weather"}
PLAIN = {**HATEFUL, "id": 9, "final_category": 0, "text_category": 0, "image_category": 0,
         "final_reason": "nothing in the meme attacks a group"}


class JudgeOnly:
    """A chat that answers only the judge (a debater call would fail the test) with label 1."""
    def __init__(self):
        self.stages = []

    def generate(self, messages, params):
        system = messages[0]["content"] if isinstance(messages[0]["content"], str) else messages[0]["content"][0]["text"]
        self.stages.append(system[:40])
        verdict = {"label": 1, "label_str": "Racist", "reason": "read the debate"}
        return ChatResult(text=json.dumps(verdict), parsed=verdict, status="ok")


def _post(acc, tmp_path):
    from PIL import Image
    p = tmp_path / f"{acc['id']}.png"
    Image.new("RGB", (8, 8)).save(p)
    return MemeRecord(str(acc["id"]), p, "a post", int(acc["final_category"] > 0), "test",
                      meta={"type": "001", "final_label_multiclass": acc["final_category"]})


def test_oracle_answers_fit_their_schemas_and_say_the_generators_account():
    prompts = Prompts(CourtConfig())
    for acc in (HATEFUL, ONE_SIDED, PLAIN):
        cues, rebuttals = oracle_cues(acc), oracle_rebuttals(acc)
        jsonschema.validate({"cues": cues}, prompts.schema("prosecutor_indirect"))
        jsonschema.validate({"rebuttals": rebuttals}, prompts.schema("defender_indirect"))
    assert oracle_cues(HATEFUL)[0]["hate_type"] == 1 and oracle_cues(HATEFUL)[0]["claim"].endswith("…")
    assert oracle_cues(ONE_SIDED)[0]["hate_type"] == 2 and oracle_cues(ONE_SIDED)[0]["claim"] == "text alone insults them"
    assert oracle_cues(PLAIN) == []                                   # nothing to accuse: the court dismisses
    assert "harmless" in oracle_rebuttals(ONE_SIDED)[0]["rebuttal"] and "right" in oracle_rebuttals(HATEFUL)[0]["rebuttal"]


def test_the_oracle_court_asks_only_the_judge(tmp_path):
    chat = JudgeOnly()
    court = OracleCourt(chat, CourtConfig(gate=False, rounds=2), {str(a["id"]): a for a in (HATEFUL, ONE_SIDED, PLAIN)})
    res = {r.id: r for r in court.run_many([_post(a, tmp_path) for a in (HATEFUL, ONE_SIDED, PLAIN)], progress=False)}
    assert len(chat.stages) == 2                                      # one judge call per debated post
    assert res["9"].route == "dismissal" and res["9"].label == 0       # no cue in either modality
    hate = res["7"]
    assert hate.route == "track2" and hate.label == 1 and [c.template for c in hate.calls][:4] == ["oracle"] * 4
    assert hate.transcript[0]["prosecutor"] == oracle_cues(HATEFUL) and hate.calls[-1].stage == "judge_indirect"
    with pytest.raises(CourtError, match="gate"):
        OracleCourt(chat, CourtConfig(gate=True), {})
    with pytest.raises(CourtError, match="no generator account"):
        OracleCourt(chat, CourtConfig(gate=False), {}).run(_post(HATEFUL, tmp_path))


def test_accounts_are_read_from_memeworld_jsonl_and_a_bad_line_is_named(tmp_path):
    f = tmp_path / "memeworld.jsonl"
    f.write_text("\n".join(json.dumps(a) for a in (HATEFUL, PLAIN)) + "\n")
    assert set(accounts_from_memeworld(f)) == {"7", "9"}
    f.write_text(json.dumps(HATEFUL) + "\n{not json\n")
    with pytest.raises(CourtError, match="line 2"):
        accounts_from_memeworld(f)


def test_no_module_of_lib_builds_a_control_from_substituted_answers_or_planted_scores():
    """The controls are pipeline arms: the helpers that once made one from another arm's answers (the fewest items
    that reach the paper's effect) or from labels (a foil-word term subtracted from foils) are gone from lib/."""
    import lib
    from pathlib import Path
    root = Path(lib.__file__).parent
    gone = ("control_at_effect", "def planted", "_at_effect", "share_control", "positive_controls")
    hits = [f"{f.relative_to(root)}: {g}" for f in root.rglob("*.py") for g in gone if g in f.read_text()]
    assert not hits, hits


def _runs(rates, n=96):
    """Fake notebook-05 runs: variant -> results whose verdict is right on the first rate x n posts."""
    from lib.arcade.court import SampleResult
    out = {}
    for name, rate in rates.items():
        res = [SampleResult(str(i), 1, "001", "Hard", "track2", label=1 if i < rate * n else 0) for i in range(n)]
        out[name] = {"results": res, "corrected": {"n": n},
                     "cost": {"gate_call_saving": 0.0, "calls_per_sample": 4.0, "calls_all_track2": 4.0}}
    return out


def test_the_oracle_courts_own_answers_are_the_claims_control():
    from lib.arcade.report import claim_frame
    t = claim_frame(_runs({"arcade": 0.45, "direct": 0.40, "oracle": 0.90}))
    assert not t["claim"].str.startswith("control:").any() and "verdict" not in t.columns
    claim = t[(t["claim"] == "debate beats a direct judge") & (t["role"] == "primary")].iloc[0]
    # the oracle run's whole difference from B (0.90 - 0.40 on the 96 posts), not a difference built to size
    assert claim["control"] == "oracle vs direct" and claim["control A-B"] == pytest.approx(0.5, abs=0.011)
    assert claim["control status"] == "detected"
    weak = claim_frame(_runs({"arcade": 0.45, "direct": 0.40, "oracle": 0.40}))    # the judge ignores the truth
    w = weak[(weak["claim"] == "debate beats a direct judge") & (weak["role"] == "primary")].iloc[0]
    assert w["control status"] == "not detected, short of the paper's effect"
    assert w[["A-B", "p", "design MDD"]].tolist() == claim[["A-B", "p", "design MDD"]].tolist()
    none = claim_frame(_runs({"arcade": 0.45, "direct": 0.40}))
    assert none[none["role"] == "primary"].iloc[0]["control"] == "oracle did not run"


def test_an_oracle_variant_reads_the_profiles_memeworld_and_others_read_nothing(tmp_path, monkeypatch):
    from lib.arcade import report
    from lib.compendium import artifacts
    monkeypatch.setattr(artifacts, "ARTIFACTS_ROOT", tmp_path)
    assert report.oracle_accounts({"samples": 8}, "nowhere") is None
    with pytest.raises(Exception, match="memeworld"):
        report.oracle_accounts({"oracle": True}, "nowhere")              # no MemeWorld: no account
    mw = tmp_path / "somewhere" / "00_data_prep" / "memeworld"
    mw.mkdir(parents=True)
    (mw / "memeworld.jsonl").write_text(json.dumps(HATEFUL) + "\n")
    assert set(report.oracle_accounts({"oracle": True}, "somewhere")) == {"7"}
    assert report.court_config({"variants": {"oracle": {"oracle": True, "gate": False}}, "class_mode": "multiclass",
                                "rounds": 1, "temperatures": {}, "max_new_tokens": {}, "prompt_dir": "params/prompts/arcade",
                                "official_prompts_repo": None, "workers": 1, "seed": 0}, "oracle").gate is False
