"""The findings table: one row per claim the compendium tests, from the committed claims tables and metrics
(the README's findings block; notebook 07 shows it from its run's artifacts).
"""
from __future__ import annotations

import csv
from pathlib import Path

from lib.compendium.artifacts import RESULTS_ROOT, read_json
from lib.evaluation import claims


def results_dir(profile: str) -> Path:
    """The committed results of a published profile (lib.compendium.results.results_dir's folder)."""
    return RESULTS_ROOT / profile


def _p(v) -> str:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return "—"
    return "—" if v != v else (f"{v:.2g}" if v < 0.001 else f"{v:.3f}")


#: the MDD cell of a claim whose discordance no difference can lift to 80% power at its n (claims.mcnemar_mdd's NaN)
NO_MDD = "none at this n"


def _mdd(v) -> str:
    """A minimum detectable difference for the table: its value, NO_MDD where the test has none (NaN), "—"
    where no test was run."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return "—"
    return NO_MDD if v != v else _p(v)


def findings_rows(profile: str, root: Path | None = None) -> list[dict[str, str]]:
    """One row per claim the embedded run tests (system, claim, arms, n, effect with its 95% interval, p, the
    paper's effect, MDD, verdict), from the committed claims tables and metrics (`root`: another stage root)."""
    d = results_dir(profile) if root is None else Path(root)
    rows: list[dict[str, str]] = []
    m2 = read_json(d / "02_finetuning" / "metrics.json") if (d / "02_finetuning" / "metrics.json").exists() else {}
    if "caption_benefit_acc" in m2 and not (d / "02_finetuning" / "claims.csv").exists():   # before 02's claims table
        seeds = (f"{m2['caption_benefit_seeds_positive']} of {m2['caption_benefit_n_seeds']} seeds positive"
                 if "caption_benefit_n_seeds" in m2 else "1 seed")
        n = int(m2["caption_benefit_n"])
        mdd = (claims.mdd_from_counts(n, m2["caption_benefit_only_default_right"], m2["caption_benefit_only_without_right"])
               if "caption_benefit_only_default_right" in m2 else float("nan"))
        paper = claims.PaperEffect()
        rows.append({"system": "TRACE", "claim": "captions help", "A vs B": "cls+rel vs image_text_only",
                     "n": f"{n} memes; {seeds}",
                     "effect": f"{m2['caption_benefit_acc']:+.3f} [{m2['caption_benefit_ci_low']:+.3f}, "
                               f"{m2['caption_benefit_ci_high']:+.3f}]",
                     "p": f"{_p(m2['caption_benefit_mcnemar_p'])} (McNemar)", "paper": paper.said,
                     "mdd": _mdd(mdd),
                     "verdict": claims.verdict(m2["caption_benefit_acc"], (m2["caption_benefit_ci_low"],
                                                                             m2["caption_benefit_ci_high"]),
                                               m2["caption_benefit_mcnemar_p"], paper.value, mdd, None)})
    m3 = read_json(d / "03_clip4dm" / "metrics.json") if (d / "03_clip4dm" / "metrics.json").exists() else {}
    if "ap_fclipscore" in m3 and not (d / "03_clip4dm" / "claims.csv").exists():    # a run before 03's claims table
        ft = d / "03_clip4dm" / "foil_table.csv"
        n = next((r["n_pairs"] for r in csv.DictReader(ft.open(encoding="utf-8")) if r["benchmark"] == "foil"), "—") \
            if ft.exists() else "—"
        rows.append({"system": "CLIP4DM", "claim": "F-CLIPScore ranks foils better than CLIPScore (FOIL AP)",
                     "A vs B": "F-CLIPScore vs CLIPScore", "n": f"{n} caption pairs; 1 trained model",
                     "effect": f"{m3['ap_fclipscore'] - m3['ap_clipscore']:+.3f} (AP {m3['ap_fclipscore']:.3f} vs "
                               f"{m3['ap_clipscore']:.3f})", "p": "— (no test yet)",
                     "paper": "—", "mdd": "—", "verdict": "no test"})
    # each stage's claims, then the claims re-tested on an embedded component adapted to MemeWorld (a named
    # option: notebook 04's moderator, notebook 05's judge), each such claim's name saying which (its notebook's tag)
    for stage, system, items, file in (
            ("02_finetuning", "TRACE", "memes", "claims.csv"), ("03_clip4dm", "CLIP4DM", "captions", "claims.csv"),
            ("04_few_shot", "See, Explain, Intervene", "memes", "claims.csv"),
            ("04_few_shot", "See, Explain, Intervene", "memes", "claims_adapted.csv"),
            ("05_debate", "ARCADE on H-VLI", "posts", "claims.csv"),
            ("05_debate", "ARCADE on H-VLI", "posts", "claims_adapted.csv")):
        f = d / stage / file
        if not f.exists():
            continue
        for r in csv.DictReader(f.open(encoding="utf-8")):
            if r.get("p") in ("", None) or r.get("role") in ("control", "descriptive") or r["claim"].startswith("control: "):
                continue          # a control's row is read in its claim's verdict; a descriptive row is no claim
            runs = int(float(r.get("runs") or 1))
            rows.append({"system": system, "claim": r["claim"], "A vs B": f"{r['A']} vs {r['B']}",
                         "n": f"{r['n']} {items}" + (f" of {r['images']} images" if r.get("images") else "")
                              + (f" x {runs} {'seeds' if 'seeds pooled' in r['claim'] else 'cold runs'}" if runs > 1 else ""),
                         "effect": f"{float(r['A-B']):+.3f} {r.get('95% CI A-B', '')}".strip(),
                         "p": f"{_p(r['p'])} ({r.get('test', 'exact McNemar')})",
                         "paper": (f"{float(r['paper A-B']):+.3f} ({r.get(claims.PAPERS_NUMBER, '')})"
                                   if r.get("paper A-B") not in ("", None) else "—"),
                         "mdd": _mdd(r.get("MDD (80% power)") or "nan"), "verdict": r.get("verdict") or "—"})
    return rows


def findings_block(profile: str = "embedded", root: Path | None = None) -> str:
    """The findings table as markdown (the README's block; notebook 07 shows it from its run's artifacts)."""
    rows = findings_rows(profile, root)
    if not rows:
        return "_No committed results yet: run `make reproduce`._"
    out = ["| system | claim | A vs B | n | A − B [95% CI] | p (test) | paper's A − B | MDD (80% power) | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['system']} | {r['claim']} | {r['A vs B']} | {r['n']} | {r['effect']} | {r['p']} | {r['paper']} | "
            f"{r['mdd']} | {r['verdict']} |" for r in rows]
    verdicts = list(dict.fromkeys(r["verdict"] for r in rows if r["verdict"] in claims.VERDICTS))
    if any(r["mdd"] == NO_MDD for r in rows):
        out += ["", f"MDD: the smallest difference the exact McNemar test detects with 80% power at the claim's n and "
                    f"observed discordance (claims.mcnemar_mdd, by enumeration); *{NO_MDD}*: no difference that "
                    f"discordance allows reaches 80% power at that n."]
    out += ["", "Verdicts: " + "; ".join(f"*{v}*: {claims.VERDICTS[v]}" for v in verdicts) + "."] if verdicts else []
    return "\n".join(out)
