"""The task agents' command line: train See-Explain-Intervene's four agents from a profile (what
notebook 04 does first), single- or multi-process. The agents themselves are `lib/sei/agents.py`."""
from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Sequence

from lib.sei.agents import AGENTS, AgentRecipe, build_agent_data, prompt_templates, train_agent
from lib.compendium.artifacts import stage_dir
from lib.data.prep import load_prepared
from lib.compendium.params import load_profile


def main(argv: Sequence[str] | None = None) -> int:
    """Fine-tune See-Explain-Intervene agents from a profile, on one device or several:

        python -m lib.sei.agents_report --profile paper --agent explainer
        accelerate launch --multi_gpu --num_processes 4 -m lib.sei.agents_report --profile paper

    Reads the profile's `04_few_shot` section (agent_base, agent_recipe, agent_overrides,
    agent_prompt_dir, seed) and the MemeCap / HatReD / MemeSense / FHM files stage 00 prepared;
    saves each agent where notebook 04 looks for it (artifacts/<profile>/04_few_shot/agents/<agent>/),
    so the notebook reuses it. Every process trains on its share of each batch (accelerate)."""
    ap = argparse.ArgumentParser(prog="python -m lib.sei.agents_report", description=main.__doc__.split("\n")[0])
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--agent", choices=AGENTS, action="append", help="one agent (repeatable; default: all four)")
    ap.add_argument("--force", action="store_true", help="train even when a saved agent has the same inputs")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    p = load_profile(a.profile).get("04_few_shot")
    if p is None:
        raise SystemExit(f"params/{a.profile}.yaml has no 04_few_shot section")
    fhm = next(iter(p["datasets"]))
    consumer = "python -m lib.sei.agents_report"
    recs = {n: load_prepared(a.profile, n, consumer).records for n in ("memecap", "hatred", "memesense", fhm)}
    data = build_agent_data(recs["memecap"], recs["hatred"], recs["memesense"], recs[fhm])
    recipe = AgentRecipe(base=p["agent_base"], prompt_dir=p["agent_prompt_dir"], seed=int(p.get("seed", 0)),
                         **p["agent_recipe"])
    templates = prompt_templates(p["agent_prompt_dir"])
    out = stage_dir(a.profile, "04_few_shot") / "agents"
    for agent in a.agent or AGENTS:
        r = replace(recipe, **p.get("agent_overrides", {}).get(agent, {}))
        rec = train_agent(data[agent], out / agent, r, templates[agent], progress=not a.no_progress, force=a.force)
        print(f"{agent}: {'reused' if rec['cached'] else 'trained'} ({rec['n_train']} examples, "
              f"final loss {rec['curve'][-1]['loss']:.3f}) -> {out / agent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
