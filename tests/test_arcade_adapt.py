"""lib.arcade.adapt: the adapted judge's training requests are the court's own requests with truthful debaters,
its answers fit the verdict schemas, only train posts are drawn, the control moves answers between posts; the
court sends verdicts (and only verdicts) to the judge's model; the claims on the adapted judge have their own
names and metric keys."""
import json

import jsonschema
import pytest

from lib.arcade import adapt
from lib.arcade.court import Court, CourtConfig, Prompts
from lib.arcade.oracle import OracleCourt, oracle_cues
from lib.data.records import MemeRecord
from lib.models.chat import ChatResult
from lib.models.llm_adapt import AdaptError

from test_debate_oracle import HATEFUL, ONE_SIDED, PLAIN, _runs

ACCOUNTS = {str(a["id"]): a for a in (HATEFUL, ONE_SIDED, PLAIN)}
CFG = CourtConfig(gate=False, rounds=2, prompt_layout="definition_first", string_max_length=48)


def _post(acc, tmp_path, split="train", typ="001"):
    from PIL import Image
    p = tmp_path / f"{acc['id']}.png"
    Image.new("RGB", (8, 8)).save(p)
    return MemeRecord(str(acc["id"]), p, f"post {acc['id']}", int(acc["final_category"] > 0), split,
                      meta={"type": typ, "final_label_multiclass": acc["final_category"]})


def _describe(conv):
    """The captioned adapter's describe(): every image part becomes a text part."""
    out = []
    for m in conv:
        parts = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        out.append({"role": m["role"], "content": [p if p["type"] == "text" else {"type": "text", "text": "[a picture]"}
                                                   for p in parts]})
    return out


def test_each_post_gives_the_courts_verdict_requests_with_the_gold_verdict(tmp_path):
    posts = [_post(a, tmp_path) for a in (HATEFUL, ONE_SIDED, PLAIN)]
    ex = adapt.verdict_examples(CFG, posts, ACCOUNTS, _describe)
    # two posts with a cue give judge, judge_indirect and baseline; the cue-less one is dismissed before Track II
    assert len(ex) == 3 + 3 + 2
    prompts = Prompts(CFG)
    for (messages, answer), stage in zip(ex, ["judge", "judge_indirect", "baseline"] * 2 + ["judge", "baseline"]):
        value = json.loads(answer)
        jsonschema.validate(value, prompts.schema(stage))            # what the constrained decoder would allow
        assert len(value["reason"]) <= 48 and "[a picture]" in messages[-1]["content"]
        assert messages[0]["content"] == ("" if stage == "baseline" else prompts.system(stage).text)
    first = json.loads(ex[0][1])
    assert (first["label"], first["label_str"]) == (1, "Racist") and ex[0][1] == json.dumps(first, separators=(",", ":"))
    assert json.loads(ex[3][1])["label"] == 0                      # ONE_SIDED: hateful text, benign together
    assert json.dumps(oracle_cues(HATEFUL), ensure_ascii=False) in ex[0][0][-1]["content"]   # the truthful accusation
    assert ex[1][0][-1]["content"].count('"round"') == CFG.rounds                              # the whole transcript
    assert ex[2][0][0]["content"] == "" and ex[2][0][1]["content"].startswith(Prompts(CFG).system("baseline").text)


def test_the_requests_equal_what_the_oracle_court_sends_its_judge(tmp_path):
    seen = []

    class Record:
        def generate(self, messages, params):
            seen.append(messages)
            v = {"label": 1, "label_str": "Racist", "reason": "r"}
            return ChatResult(text=json.dumps(v), parsed=v, status="ok")
    post = _post(HATEFUL, tmp_path)
    OracleCourt(Record(), CFG, ACCOUNTS).run(post)

    def img(conv):
        return [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
                 [p if p["type"] == "text" else {"type": "text", "text": "<img>"} for p in m["content"]]} for m in conv]
    ex = adapt.verdict_examples(CFG, [post], ACCOUNTS, img, stages=["judge_indirect"])
    assert len(seen) == 1 and ex[0][0] == [{"role": m["role"], "content": "".join(p["text"] for p in m["content"])
                                            if isinstance(m["content"], list) else m["content"]} for m in img(seen[0])]
    with pytest.raises(AdaptError, match="image"):                 # no describe(): the picture is still there
        adapt.verdict_examples(CFG, [post], ACCOUNTS, None)


def test_the_control_moves_whole_verdicts_between_posts_and_keeps_the_requests(tmp_path):
    posts = [_post({**HATEFUL, "id": i, "final_category": i % 3}, tmp_path) for i in range(1, 13)]
    accounts = {str(p.id): {**HATEFUL, "id": int(p.id), "final_category": int(p.id) % 3, "text_category": 1,
                            "final_reason": f"reason of post {p.id}"} for p in posts}   # every post has a cue
    real = adapt.verdict_examples(CFG, posts, accounts, _describe)
    ctl = adapt.verdict_examples(CFG, posts, accounts, _describe, shuffle_labels=True, seed=3)
    assert [m for m, _ in real] == [m for m, _ in ctl]                                  # the same requests
    assert sorted(a for _, a in real) == sorted(a for _, a in ctl) and real != ctl      # the same answers, moved
    for k in range(0, len(ctl), 3):                                 # one post's three answers move together
        assert len({(json.loads(a)["label"], json.loads(a)["reason"]) for _, a in ctl[k:k + 3]}) == 1
    assert ctl == adapt.verdict_examples(CFG, posts, accounts, _describe, shuffle_labels=True, seed=3)
    assert adapt.label_counts(real) == adapt.label_counts(ctl)


def test_training_posts_come_from_the_train_split_only(tmp_path):
    recs = [_post({**HATEFUL, "id": i}, tmp_path, split="train" if i % 2 else "test", typ=f"{i % 8:03b}")
            for i in range(1, 41)]
    posts = adapt.training_posts(recs, 8, seed=2024)
    assert len(posts) == 8 and all(p.split == "train" for p in posts)
    assert [p.id for p in posts] == [p.id for p in adapt.training_posts(list(reversed(recs))[::-1], 8, seed=2024)]
    with pytest.raises(AdaptError, match="no post of split 'train'"):
        adapt.training_posts([r for r in recs if r.split == "test"], 4)


def test_bad_inputs_name_what_is_missing(tmp_path):
    post = _post(HATEFUL, tmp_path)
    with pytest.raises(AdaptError, match="no generator account"):
        adapt.verdict_examples(CFG, [post], {}, _describe)
    with pytest.raises(AdaptError, match="only judge"):
        adapt.verdict_examples(CFG, [post], ACCOUNTS, _describe, stages=["prosecutor"])
    with pytest.raises(AdaptError, match="no label_str"):
        adapt.verdict_answer(Prompts(CFG).schema("judge"), 9, "why", 48)


def test_the_court_sends_verdicts_to_the_judges_model_and_debates_to_the_debaters(tmp_path):
    class Scripted:
        def __init__(self, who):
            self.who, self.stages = who, []

        def generate(self, messages, params):
            system = messages[0]["content"] if isinstance(messages[0]["content"], str) else messages[0]["content"][0]["text"]
            self.stages.append(system[:30])
            keys = set((params.json_schema or {}).get("properties", {}))
            if "label" in keys:
                v = {"label": 2, "label_str": "Sexist", "reason": self.who} if "label_str" in keys else {"label": 2, "reason": self.who}
            else:
                v = {"cues": []} if "cues" in keys else {"rebuttals": []}
            return ChatResult(text=json.dumps(v), parsed=v, status="ok")
    debaters, judge = Scripted("debaters"), Scripted("judge")
    cfg = CourtConfig(gate=True, rounds=1)
    res = Court(debaters, cfg, judge_chat=judge).run(_post(HATEFUL, tmp_path))
    assert res.route == "dismissal" and judge.stages == []          # no cue: dismissed without a verdict
    base = Court(debaters, CourtConfig(run_mode="none"), judge_chat=judge).run(_post(HATEFUL, tmp_path))
    assert base.label == 2 and base.reason == "judge" and len(judge.stages) == 1
    oracle = OracleCourt(debaters, CourtConfig(gate=False, rounds=1), ACCOUNTS, judge_chat=judge).run(_post(HATEFUL, tmp_path))
    assert oracle.reason == "judge" and len(judge.stages) == 2 and len(debaters.stages) == 2   # the rapid scan, the indirect prosecutor


def test_the_adapted_judges_claims_have_their_own_names_and_keys():
    from lib.arcade.report import adapted_runs, claim_frame, stage_metrics
    runs = _runs({"arcade": 0.45, "direct": 0.40, "oracle": 0.40,
                  "arcade_adapted": 0.70, "direct_adapted": 0.45, "oracle_adapted": 0.95, "oracle_shuffled": 0.3})
    ad = adapted_runs(runs)
    assert set(ad) == {"arcade_adapted", "direct_adapted", "oracle_adapted"}
    t = claim_frame(ad, suffix="_adapted", tag=" (adapted judge)")
    claim = t[t["claim"] == "debate beats a direct judge (adapted judge)"].iloc[0]
    assert (claim["A"], claim["B"], claim["control"]) == ("arcade_adapted", "direct_adapted",
                                                           "oracle_adapted vs direct_adapted")
    assert claim["control status"] == "detected" and claim["id"] == "arcade.debate_vs_direct.adapted"
    assert claim["A-B"] == pytest.approx(0.25, abs=0.02) and claim["p"] < 0.001
    assert "the gate saves calls" not in set(t["claim"])
    main = claim_frame(runs)
    assert set(main["A"]) >= {"arcade"} and not main["A"].str.endswith("_adapted").any()
    for r in runs.values():
        r.update({"official": {"acc": 0.5, "n_refused": 0}, "cost": {**r["cost"], **dict.fromkeys(
            ("calls_per_sample_track1", "calls_per_sample_track2", "share_track1", "share_track2", "share_dismissal",
             "tokens_per_sample"), 0.0)}})
        r["corrected"].update({k: 0.5 for k in ("acc", "acc_easy", "acc_normal", "acc_hard", "acc_normal_hard")})
    m = stage_metrics(runs, 0.5, 0, main, None, None, t)
    assert m["claim_arcade_adapted_vs_direct_adapted_n"] == 96 and "claim_arcade_vs_direct_n" in m
