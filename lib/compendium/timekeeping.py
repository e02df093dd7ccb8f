"""How long stages take: the times a run records (timings.json: from nothing, a fresh clone's, the latest run), the
estimates a run prints of the stages still to come, and the words for them."""
from __future__ import annotations

import time
from typing import Any

from lib.compendium import results
from lib.compendium.artifacts import ARTIFACTS_ROOT, read_json
from lib.compendium.params import Stage


#: where a stage's expected time comes from, by the kind of run: one that asks every model afresh (COLD=1)
#: takes about its time from nothing; any other run starts a stage the way a fresh clone does (models
#: trained, the committed answers replayed) or resumes it; the latest run, whatever it reused, is the
#: last resort. The words say which record an estimate rests on.
ESTIMATE_SOURCES = {"stages": "from nothing", "replayed": "fresh clone", "last_run": "latest run"}


def estimates(profile: str, cold: bool = False) -> dict[str, tuple[float, str]]:
    """stage -> (seconds it is expected to take, which record that is: ESTIMATE_SOURCES' words), from this
    machine's timings.json over the committed one. A stage with no usable record is absent: the caller says
    it cannot be estimated rather than count it as zero."""
    order = ("stages", "replayed", "last_run") if cold else ("replayed", "stages", "last_run")
    records: dict[str, dict[str, float]] = {k: {} for k in order}
    for f in (results.timings_path(profile), ARTIFACTS_ROOT / profile / "timings.json"):
        if not f.exists():
            continue
        try:
            data = read_json(f)
        except ValueError:
            continue                                       # a damaged record only costs the estimate
        for key in order:
            rows = data.get(key) if isinstance(data, dict) else None
            for stage, row in (rows.items() if isinstance(rows, dict) else ()):
                try:
                    records[key][stage] = float(row["wall_s"])
                except (KeyError, TypeError, ValueError):
                    pass
    out: dict[str, tuple[float, str]] = {}
    for key in reversed(order):                            # the preferred record is written last and wins
        out.update({stage: (s, ESTIMATE_SOURCES[key]) for stage, s in records[key].items()})
    return out


def time_left(names: list[str], est: dict[str, tuple[float, str]]) -> str:
    """The words for the time `names` (the stages still to run, in order) should take: their estimates'
    sum, and the stages that have none named rather than counted as zero."""
    known = sum(est[n][0] for n in names if n in est)
    unknown = [n for n in names if n not in est]
    if not unknown:
        return f"about {_minutes(known)} left in this run"
    if len(unknown) == len(names):
        return "no time recorded for " + ", ".join(unknown) + ": the time left cannot be estimated"
    return f"about {_minutes(known)} left in this run, besides {', '.join(unknown)} (no time recorded)"


def _slowest_cell(profile: str, st: Stage) -> float | None:
    """The seconds of the stage's slowest cell in the run that just ended (its cells.json), for the cell timeout."""
    f = ARTIFACTS_ROOT / profile / "notebooks" / f"{st.name}.cells.json"
    try:
        cells = read_json(f).get("cells", []) if st.notebook is not None and f.exists() else []
        return max((float(c["seconds"]) for c in cells), default=None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def record_timing(timings: dict[str, Any], stage: str, wall_s: float, cold: bool, fresh: bool = False,
                  params: str | None = None, slowest_cell_s: float | None = None) -> dict[str, Any]:
    """timings.json: `stages` holds each stage's time from nothing (a run that found none of the stage's
    own outputs, trained models or cached answers: its cold cost), which a rerun on caches does not
    replace, and nothing else: a stage never run from nothing has no entry (the README says "not measured"
    rather than show a time that reused earlier runs' work); `replayed` holds the time of a stage that
    started without its folder (every model of it trained, every run made) but replayed model answers an
    earlier run asked: a fresh clone's `make reproduce`, which replays the committed answers; `last_run`
    holds every stage's time in the latest run, whatever it reused. `params`: the digest of the stage's
    parameters it ran at (params.section_digest), kept with each time so the README can say which times were
    measured at parameters that have changed since. `slowest_cell_s`: its slowest cell (the cell timeout's base)."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    timings.setdefault("stages", {})
    timings.setdefault("last_run", {})
    row = {"wall_s": round(wall_s, 1), "cold": cold, "finished": when, **({"params": params} if params else {}),
           **({"slowest_cell_s": round(slowest_cell_s, 1)} if slowest_cell_s is not None else {})}
    if cold:
        timings["stages"][stage] = row
    elif fresh:
        timings.setdefault("replayed", {})[stage] = row
    timings["last_run"][stage] = row
    timings["machine"] = results.machine_description()
    return timings


def _minutes(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"
