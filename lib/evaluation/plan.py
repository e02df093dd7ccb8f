"""The analysis plan (params/analysis/plan.yaml): every claim the findings table tests, with its arms, unit, test,
n, the paper's effect, role, family, control and baseline, fixed before the run that tests it. Stages read their
claims from it (so the plan is an input of their stamps) and record its digest beside their results; the findings
table is built from it and the verdict rules (lib.evaluation.verdicts).
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import yaml

from lib import ROOT

PLAN_FILE = ROOT / "params" / "analysis" / "plan.yaml"
#: the units a claim's test can have, and the test each gives
UNITS = {"items": "exact McNemar", "cold runs": "sign-flip over items on per-item means of the runs",
         "seeds": "paired t over seeds", "seeds pooled": "sign-flip over items, the seeds pooled",
         "images": "paired bootstrap over images", "two shares": "Fisher exact (two shares)"}
ROLES = ("primary", "secondary")


class PlanError(ValueError):
    """The plan file is malformed: the message names the file, the claim and the field."""


@dataclasses.dataclass(frozen=True)
class Secondary:
    unit: str
    runs: int
    what: str
    n: int | None = None


@dataclasses.dataclass(frozen=True)
class PlannedClaim:
    id: str
    system: str
    statement: str
    stage: str
    table: str
    a: str
    b: str
    unit: str
    runs: int
    n: int
    items: str
    test: str
    paper_effect: float | None
    paper_source: str | None
    role: str
    family: str
    control: str | None
    baseline: str | None
    secondary: tuple[Secondary, ...] = ()
    grown_n: int | None = None

    @property
    def effect(self) -> float:
        return float(self.paper_effect) if self.paper_effect is not None else load().default_effect

    @property
    def effect_said(self) -> str:
        return (f"{self.paper_effect:+.3f} ({self.paper_source})" if self.paper_effect is not None
                else f"{load().default_effect:+.3f} (none published: held to {load().default_effect:.2f})")


@dataclasses.dataclass(frozen=True)
class Plan:
    version: int
    alpha: float
    power: float
    default_effect: float
    correction: str
    families: dict[str, str]
    looks: str
    history: tuple[dict[str, Any], ...]
    claims: tuple[PlannedClaim, ...]
    digest: str

    def of(self, stage: str, table: str | None = None) -> list[PlannedClaim]:
        """The claims a stage's table tests, in plan order."""
        return [c for c in self.claims if c.stage == stage and (table is None or c.table == table)]

    def family_sizes(self) -> dict[str, int]:
        """Each family's number of primary claims (m of its Holm correction and family-wise intervals)."""
        return {f: sum(c.family == f and c.role == "primary" for c in self.claims) for f in self.families}

    def by_statement(self, stage: str, table: str) -> dict[str, PlannedClaim]:
        return {c.statement: c for c in self.of(stage, table)}


_FIELDS = {f.name for f in dataclasses.fields(PlannedClaim)}
_REQUIRED = _FIELDS - {"secondary", "grown_n"}
_CACHE: dict[tuple[str, int, int], Plan] = {}


def load(path: Path | None = None) -> Plan:
    """The plan, checked: every claim with exactly the fields PlannedClaim names, a known unit and role, a unique
    id and statement per table, a family the plan declares. Cached while the file is unchanged."""
    path = Path(path or PLAN_FILE)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise PlanError(f"{path}: no analysis plan (params/analysis/plan.yaml lists every claim the findings "
                        f"table tests)") from None
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _CACHE:
        return _CACHE[key]
    raw = path.read_bytes()
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    try:
        doc = yaml.safe_load(raw) or {}
    except yaml.YAMLError as e:
        raise PlanError(f"{where}: not valid YAML: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list):
        raise PlanError(f"{where}: expected a mapping with a list `claims`")
    families = dict(doc.get("families") or {})
    claims, seen, said = [], set(), set()
    for k, c in enumerate(doc["claims"]):
        at = f"{where}: claims[{k}]" + (f" ({c.get('id')})" if isinstance(c, dict) and c.get("id") else "")
        if not isinstance(c, dict):
            raise PlanError(f"{at}: a claim is a mapping")
        unknown, missing = sorted(set(c) - _FIELDS), sorted(_REQUIRED - set(c))
        if unknown or missing:
            raise PlanError(f"{at}: " + (f"unknown field {unknown[0]!r}" if unknown else f"field {missing[0]!r} is missing"))
        if c["unit"] not in UNITS:
            raise PlanError(f"{at}: field 'unit' is {c['unit']!r}, not one of {', '.join(UNITS)}")
        if c["role"] not in ROLES:
            raise PlanError(f"{at}: field 'role' is {c['role']!r}, not one of {', '.join(ROLES)}")
        if c["family"] not in families:
            raise PlanError(f"{at}: field 'family' is {c['family']!r}, which the plan's `families` does not declare")
        if c["id"] in seen or (c["stage"], c["table"], c["statement"]) in said:
            raise PlanError(f"{at}: a second claim with this id or statement")
        seen.add(c["id"])
        said.add((c["stage"], c["table"], c["statement"]))
        sec = []
        for j, s in enumerate(c.get("secondary") or []):
            if not isinstance(s, dict) or s.get("unit") not in UNITS or "runs" not in s or "what" not in s:
                raise PlanError(f"{at}: secondary[{j}] needs a unit of {', '.join(UNITS)}, runs and what")
            sec.append(Secondary(s["unit"], int(s["runs"]), str(s["what"]), s.get("n")))
        claims.append(PlannedClaim(**{**c, "secondary": tuple(sec)}))
    plan = Plan(int(doc.get("version", 0)), float(doc.get("alpha", 0.05)), float(doc.get("power", 0.8)),
                float(doc.get("default_effect", 0.10)), str(doc.get("correction", "holm")), families,
                str(doc.get("looks", "")), tuple(doc.get("history") or ()), tuple(claims),
                hashlib.sha256(raw).hexdigest()[:12])
    _CACHE[key] = plan
    return plan


def digest() -> str:
    """The plan's digest: every committed claims table records the one it was computed under."""
    return load().digest
