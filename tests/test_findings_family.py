"""The findings table's Holm family and its refusals, on claims tables written here (no run needed).

A family's correction is over every primary claim the plan puts in it: a claim that did not run, ran under
another plan, or has no p counts as p = 1, so what happens to one claim never weakens the others' correction.
A claims table without the plan's columns is refused with its file named, never read as "not run"."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lib.compendium import findings
from lib.evaluation import plan as analysis


def _write(root: Path, rows_by_claim: dict[str, dict], digest: str | None = None) -> None:
    plan = analysis.load()
    tables: dict[tuple[str, str], list[dict]] = {}
    for c in plan.claims:
        if c.id in rows_by_claim:
            row = {"id": c.id, "role": c.role, "plan": digest or plan.digest, "A": c.a, "B": c.b, "n": c.n or 10,
                   "test": c.test, "A-B": 0.2, "95% CI A-B": "[0.1, 0.3]", "family-wise CI A-B": "[0.05, 0.35]",
                   "p": 0.001, "as planned": "yes", "runs": 1}
            row.update(rows_by_claim[c.id])
            tables.setdefault((c.stage, c.table), []).append(row)
    for (stage, table), rows in tables.items():
        f = root / stage / table
        f.parent.mkdir(parents=True, exist_ok=True)
        cols = list(dict.fromkeys(k for r in rows for k in r))
        with f.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, cols)
            w.writeheader()
            w.writerows(rows)


def _primary(family: str = "findings") -> list[str]:
    return [c.id for c in analysis.load().claims if c.family == family and c.role == "primary"]


def test_holm_counts_every_planned_claim_even_those_that_did_not_run(tmp_path):
    m = analysis.load().family_sizes()["findings"]
    assert m >= 2
    first = _primary()[0]
    _write(tmp_path, {first: {"p": 0.001}})
    got = {r["id"]: r for r in findings.findings_rows("embedded", tmp_path)}
    # alone in its table, its p is still corrected for the whole planned family: m * p, not 1 * p
    assert float(got[first]["p adjusted"]) == pytest.approx(min(1.0, m * 0.001), rel=0.01)
    assert sum(r["verdict"] == "not run" for r in got.values()) == len(got) - 1


def test_a_claim_without_p_or_off_plan_does_not_weaken_the_others(tmp_path):
    ids = _primary()
    a, b, c = ids[:3]
    p_alone = {}
    _write(tmp_path / "one", {a: {"p": 0.001}})
    p_alone = float({r["id"]: r for r in findings.findings_rows("embedded", tmp_path / "one")}[a]["p adjusted"])
    # b has no p (every seed agreed), c ran off-plan: a's correction must be exactly as strong as when they were absent
    _write(tmp_path / "three", {a: {"p": 0.001}, b: {"p": "nan"}, c: {"p": 0.0001, "as planned": "no (n 5)"}})
    got = {r["id"]: r for r in findings.findings_rows("embedded", tmp_path / "three")}
    assert float(got[a]["p adjusted"]) == pytest.approx(p_alone)
    assert got[b]["p adjusted"] == "—" and got[b]["verdict"] in ("inconclusive", "not reproduced")
    assert got[c]["verdict"].startswith("not run as planned")


def test_a_table_under_another_plan_gets_no_verdict_of_this_plan(tmp_path):
    first = _primary()[0]
    _write(tmp_path, {first: {"p": 1e-6}}, digest="000000000000")
    row = {r["id"]: r for r in findings.findings_rows("embedded", tmp_path)}[first]
    assert row["verdict"].startswith("stale: computed under plan 000000000000")


@pytest.mark.parametrize("drop", ["id", "plan", "role"])
def test_a_claims_table_without_the_plans_columns_is_refused_by_name(tmp_path, drop):
    first = _primary()[0]
    _write(tmp_path, {first: {}})
    c = next(c for c in analysis.load().claims if c.id == first)
    f = tmp_path / c.stage / c.table
    rows = list(csv.DictReader(f.open(encoding="utf-8")))
    with f.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, [k for k in rows[0] if k != drop])
        w.writeheader()
        w.writerows([{k: v for k, v in r.items() if k != drop} for r in rows])
    with pytest.raises(ValueError, match=rf"{f.name}.*{drop}"):
        findings.findings_rows("embedded", tmp_path)
