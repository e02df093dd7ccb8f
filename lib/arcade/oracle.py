"""Oracle debaters: the court's positive control and the judge's isolated check (MemeWorld only).

The prosecutor and the defender say what MemeWorld's generator knows of each post instead of asking a
model: the prosecutor brings the post's true cue (the reason the generator gives for its label, the target
group and the category) and the defender the true benign account where there is one, conceding otherwise.
Only the judge is asked. If a judge given the truth by both sides still cannot beat the real debate by the
paper's effect, the claim's test cannot see a debate that works, and the judge is the component that fails
(the mechanisms issue's check). A real dataset has no generator's account, so the paper profile has no
such control.

    court = OracleCourt(chat, CourtConfig(gate=False), accounts_from_memeworld(memeworld_jsonl))
    results = court.run_many(posts)

Every post goes through Track II (`gate=False`): the rapid scan is a model's call, and a post whose
prosecutor truthfully finds nothing (a post with no cue in either modality) is dismissed as the court
dismisses it, without the judge.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lib.arcade.court import ROLE, CallTrace, Court, CourtConfig, CourtError, SampleResult

#: the length the schemas allow each debater string (arcade_prosecutor_indirect.json, arcade_defender.json)
FIELD_MAX = 120
#: debater stages an oracle answers; any other stage is the judge's (or the gate's) and goes to the model
ORACLE_STAGES = ("prosecutor_indirect", "defender_indirect", "prosecutor_round2", "defender_round2")


def _cut(s: str) -> str:
    return s if len(s) <= FIELD_MAX else s[:FIELD_MAX - 1].rstrip() + "…"


def accounts_from_memeworld(path: str | Path) -> dict[str, dict[str, Any]]:
    """The generator's account of every MemeWorld meme (memeworld.jsonl), by id as a string."""
    out: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out[str(rec["id"])] = rec
        except (ValueError, KeyError) as e:
            raise CourtError(f"{path}: line {n} is not a MemeWorld record ({type(e).__name__}: {e})") from None
    return out


def oracle_cues(account: dict[str, Any]) -> list[dict[str, Any]]:
    """The prosecutor's true cues (arcade_prosecutor_indirect.json's items): the combined reading's reason
    when the post is hateful; a modality's own hateful reading when only it is (and the combination is not);
    none when neither modality carries one."""
    final, text, image = (int(account.get(k) or 0) for k in ("final_category", "text_category", "image_category"))
    group = str(account.get("group") or "a group")
    if final:
        claim, category = account.get("final_reason") or "the post attacks the group", final
    elif text or image:
        side = "text" if text else "image"
        claim, category = account.get(f"{side}_reason") or f"the {side} alone attacks the group", text or image
    else:
        return []
    why = f"text: {account.get('text_reason', '')}; picture: {account.get('image_reason', '')}"
    return [{"id": 1, "cue_type": "Socio-cultural", "target_group": _cut(group), "hate_type": int(category),
             "claim": _cut(str(claim)), "justification": _cut(why)}]


def oracle_rebuttals(account: dict[str, Any]) -> list[dict[str, Any]]:
    """The defender's true answer (arcade_defender.json's items): the generator's reason for the combined
    label, as a rebuttal when the post is benign and as a concession when it is hateful."""
    reason = str(account.get("final_reason") or "")
    if int(account.get("final_category") or 0):
        return [{"id": 1, "evidence": _cut(reason), "rebuttal": "No benign reading holds: the accusation is right."}]
    return [{"id": 1, "evidence": _cut(reason), "rebuttal": _cut(f"Read together the post is harmless: {reason}")}]


class OracleCourt(Court):
    """The court with oracle debaters: `accounts` (post id -> generator record) answer every debater stage,
    the judge is the model's. Each oracle answer is traced like a call (template "oracle", no tokens)."""

    def __init__(self, chat, cfg: CourtConfig = CourtConfig(gate=False), accounts: dict[str, dict[str, Any]] | None = None,
                 judge_chat=None):
        if cfg.gate:
            raise CourtError("OracleCourt: set gate: false (the rapid scan is a model's call; every post goes "
                             "through Track II, where the oracle debaters speak)")
        super().__init__(chat, cfg, judge_chat)
        self.accounts = accounts or {}

    def _debater(self, stage: str, sample, round_: int, res: SampleResult, **fields: Any) -> tuple[bool, Any]:
        if stage not in ORACLE_STAGES:
            return super()._debater(stage, sample, round_, res, **fields)
        account = self.accounts.get(str(sample.id))
        if account is None:
            raise CourtError(f"OracleCourt: post {sample.id!r} has no generator account (MemeWorld's "
                             f"memeworld.jsonl): an oracle debate needs one for every post")
        value = oracle_cues(account) if ROLE[stage] == "prosecutor" else oracle_rebuttals(account)
        res.calls.append(CallTrace(stage, ROLE[stage], round_, 0.0, "oracle", "ok", output=value,
                                   raw=json.dumps(value, ensure_ascii=False)))
        return True, value
