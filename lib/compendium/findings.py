"""The findings table: one row per claim of the analysis plan (params/analysis/plan.yaml), from the committed claims
tables, its p corrected across the claim's family (Holm) and its verdict given by the rules of
lib.evaluation.verdicts from the corrected test alone. The README shows a block a newcomer reads at a glance
(claim, effect with interval, verdict); docs/findings.md and notebook 07 the whole table: test, n, unit, raw and
adjusted p, the design's MDD beside the paper's effect, control, baseline, component check and flags.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from lib.compendium.artifacts import RESULTS_ROOT
from lib.evaluation import plan as analysis
from lib.evaluation.verdicts import decide, legend, verdict

#: what the findings table calls each plan unit
UNIT_WORDS = {"items": "", "cold runs": " x {runs} cold runs (per-item means)", "seeds": " x {runs} seeds",
              "images": "", "two shares": ""}


def results_dir(profile: str) -> Path:
    """The committed results of a published profile (lib.compendium.results.results_dir's folder)."""
    return RESULTS_ROOT / profile


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _p(v: Any) -> str:
    v = _num(v)
    return "—" if v != v else (f"{v:.2g}" if v < 0.001 else f"{v:.3f}")


INTERVAL = re.compile(r"\[\s*([-+0-9.eE]+|nan)\s*,\s*([-+0-9.eE]+|nan)\s*\]")


def _interval(text: Any) -> tuple[float, float]:
    """An interval as a claims table writes it ("[lo, hi]", maybe followed by its level); NaNs when there is none."""
    m = INTERVAL.search(str(text))
    return (float(m.group(1)), float(m.group(2))) if m else (float("nan"), float("nan"))


def _tables(d: Path, plan: analysis.Plan) -> dict[tuple[str, str], list[dict[str, str]]]:
    out = {}
    for stage, table in dict.fromkeys((c.stage, c.table) for c in plan.claims):
        f = d / stage / table
        if not f.exists():
            out[stage, table] = []
            continue
        with f.open(encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
        missing = [k for k in ("id", "plan", "role") if k not in (reader.fieldnames or [])]
        if missing:           # a table from before the plan, or not a claims table: no claim can be found in it
            raise ValueError(f"{f}: a planned claims table without the column(s) {', '.join(missing)} (written "
                             f"before the analysis plan?); rerun stage {stage} to compute it under the plan")
        out[stage, table] = rows
    return out


def plans_used(profile: str, root: Path | None = None) -> dict[str, set[str]]:
    """Each planned claims table -> the plan digests its rows record (a table computed under another plan shows
    another digest, or none)."""
    d = results_dir(profile) if root is None else Path(root)
    plan = analysis.load()
    return {f"{stage}/{table}": {r.get("plan", "") for r in rows} for (stage, table), rows in _tables(d, plan).items()
            if rows}


def findings_rows(profile: str, root: Path | None = None) -> list[dict[str, Any]]:
    """One row per claim of the plan: its primary test from its stage's committed claims table (`root`: another
    stage root, e.g. a run's artifacts), the p adjusted across its family (the plan's correction, Holm), and its
    verdict from the adjusted test alone. A claim whose arms did not run has no test and no verdict ("not run")."""
    d = results_dir(profile) if root is None else Path(root)
    plan = analysis.load()
    tables = _tables(d, plan)
    rows = []
    for c in plan.claims:
        found = next((r for r in tables[c.stage, c.table] if r.get("id") == c.id and r.get("role") == c.role), None)
        rows.append({"claim": c, "row": found})
    for family in plan.families:
        # Holm's family is every primary claim the plan puts in it (m = plan.family_sizes(), the m of the family-wise
        # intervals too): a claim that did not run, ran off-plan, under another plan or has no p takes its place in
        # the family as p = 1, so what happened to one claim can never make the correction of the others weaker
        members = [x for x in rows if x["claim"].family == family and x["claim"].role == "primary"]
        ran = [bool(x["row"]) and x["row"].get("as planned", "yes") == "yes" and x["row"].get("plan") == plan.digest
               for x in members]
        has_p = [ok and _num(x["row"]["p"]) == _num(x["row"]["p"]) for x, ok in zip(members, ran)]
        decided = decide([{"p": _num(x["row"]["p"]) if ok else 1.0,
                           "difference": _num(x["row"]["A-B"]) if ok else float("nan"),
                           "family_ci": _interval(x["row"].get("family-wise CI A-B", "")) if ok
                           else (float("nan"), float("nan")), "effect": x["claim"].effect}
                          for x, ok in zip(members, has_p)], plan.alpha)
        for x, r, ok, d in zip(members, ran, has_p, decided):
            if not r:
                continue
            if ok:
                x["p_adjusted"], x["verdict"] = d["p_adjusted"], d["verdict"]
            else:                                   # ran as planned without a p: adjusted p NaN, never significant
                x["p_adjusted"] = float("nan")
                x["verdict"] = verdict(_num(x["row"]["A-B"]), _interval(x["row"].get("family-wise CI A-B", "")),
                                       float("nan"), x["claim"].effect, plan.alpha)
    out = []
    for x in rows:
        c, r = x["claim"], x["row"]
        if r is None:
            out.append({"id": c.id, "system": c.system, "claim": c.statement, "A vs B": f"{c.a} vs {c.b}",
                        "n": "—", "effect": "—", "family ci": "—", "test": c.test, "p": "—", "p adjusted": "—",
                        "mdd": "—", "paper": c.effect_said, "control": "—", "baseline": "—", "checks": "—",
                        "verdict": "not run", "plan": "—", "role": c.role})
            continue
        diff, ci = _num(r["A-B"]), _interval(r["95% CI A-B"])
        fam = _interval(r.get("family-wise CI A-B", ""))
        padj = x.get("p_adjusted", float("nan"))
        runs = int(_num(r.get("runs")) or 1)
        n_text = f"{r['n']} {c.items}" + (f" of {r['images']} images" if r.get("images") else "") \
            + UNIT_WORDS.get(c.unit, "").format(runs=runs)
        ctl = r.get("control") or "—"
        if r.get("control A-B") not in (None, "", "nan"):
            ctl = (f"{ctl}: {_num(r['control A-B']):+.3f} {r.get('control 95% CI', '')}, p {_p(r['control p'])} "
                   f"({r.get('control status')}; {r.get('control test')}, n {r.get('control n')})")
        base = r.get("baseline") or "—"
        if base not in ("—", "") and r.get("A-baseline") not in (None, ""):
            base = f"{base} {_num(r['baseline acc']):.3f}: A {_num(r['A-baseline']):+.3f}, p {_p(r['baseline p'])}"
        checks = "; ".join(x for x in (
            f"precondition {r['precondition']}" if r.get("precondition") not in (None, "", "not measured") else "",
            r.get("component check") if r.get("component check") not in (None, "", "none") else "",
            r.get("flag") if r.get("flag") not in (None, "", "none") else "") if x) or "—"
        planned = r.get("as planned", "yes")
        if r.get("plan", "") != plan.digest:           # computed under another plan: this plan's verdict is not its own
            v = f"stale: computed under plan {r.get('plan') or '(none)'}, not {plan.digest}"
        elif c.role != "primary":
            v = "no verdict (secondary)"
        elif planned != "yes":
            v = f"not run as planned ({planned})"
        else:
            v = x["verdict"]
        out.append({"id": c.id, "system": c.system, "claim": c.statement, "A vs B": f"{r['A']} vs {r['B']}",
                    "n": n_text, "effect": f"{diff:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]",
                    "family ci": f"[{fam[0]:+.3f}, {fam[1]:+.3f}]" if fam[0] == fam[0] else "—", "test": r["test"],
                    "p": _p(r["p"]), "p adjusted": _p(padj) if c.role == "primary" else "— (secondary)",
                    "mdd": _p(r.get("design MDD")), "paper": c.effect_said, "control": ctl, "baseline": base,
                    "checks": checks, "role": c.role, "plan": r.get("plan", ""), "verdict": v})
    return out


def findings_block(profile: str = "embedded", root: Path | None = None) -> str:
    """The README's block: claim, effect with its interval, verdict (the whole table: docs/findings.md)."""
    rows = findings_rows(profile, root)
    if not any(r["verdict"] != "not run" for r in rows):
        return "_No committed results yet: run `make reproduce`._"
    plan = analysis.load()
    out = ["| system | claim | A − B [95% CI] | verdict |", "|---|---|---|---|"]
    out += [f"| {r['system']} | {r['claim']} | {r['effect']} | {r['verdict']} |" for r in rows if r["role"] == "primary"]
    out += ["", f"{sum(r['role'] == 'primary' for r in rows)} primary claims of the analysis plan (version "
                f"{plan.version}, [docs/analysis-plan.md](docs/analysis-plan.md)), their p corrected together "
                f"({plan.correction}); each verdict comes from its claim's own test alone: " + legend() + ". A claim "
                f"that did not run as its plan says (another n, fewer runs) gets no verdict. The plan's version 1 was "
                f"written after these results existed, by a rule that looks at no outcome; every later change is in "
                f"its history. Every column (test, n, raw and adjusted p, the family-wise interval, the design's MDD "
                f"beside the paper's effect, control, baseline, checks): [docs/findings.md](docs/findings.md)."]
    return "\n".join(out)


def findings_table(profile: str = "embedded", root: Path | None = None) -> str:
    """The whole findings table as markdown (docs/findings.md; notebook 07 shows it from its run's artifacts)."""
    rows = findings_rows(profile, root)
    cols = ("system", "claim", "A vs B", "n", "effect", "family ci", "test", "p", "p adjusted", "mdd", "paper",
            "control", "baseline", "checks", "verdict")
    head = ("system", "claim", "A vs B", "n", "A − B [95% CI]", "family-wise CI", "test", "p", "p (Holm)",
            "design MDD (80%, alpha/m)",
            "paper's A − B", "positive control (a pipeline arm vs B)", "no-model baseline (vs A)",
            "precondition, component check, flags", "verdict")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(r[c]).replace("|", "/") for c in cols) + " |" for r in rows]
    return "\n".join(out)


def findings_page(profile: str = "embedded") -> str:
    """docs/findings.md: the analysis plan's claims as the committed results test them."""
    plan = analysis.load()
    return ("# Findings: every claim of the analysis plan\n\n"
            "Generated by `make results` from `results/embedded/` and `params/analysis/plan.yaml` (version "
            f"{plan.version}, digest `{plan.digest}`: [its history](analysis-plan.md)); do not edit by hand. One row "
            "per planned claim: its primary test (the plan's unit: items, cold runs as per-item means, seeds), the p "
            f"corrected across the family ({plan.correction}), its family-wise interval, the design's minimum "
            f"detectable difference at {plan.power:.0%} power and Holm's strictest threshold (alpha/m) beside the "
            "paper's effect, its positive control (a pipeline arm where the "
            "ingredient carries the signal, against the claim's B arm, with the claim's test), its no-model baseline "
            "(against A), and what the checks say beside it. Verdicts: " + legend() + ". Preconditions, component "
            "checks, controls, baselines and flags never change a verdict; the notebooks' readings say what each "
            "means.\n\n" + findings_table(profile) + "\n")
