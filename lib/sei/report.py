"""Notebook 04's steps and claims (See, Explain, Intervene); its frames and plots are `lib.sei.analysis`,
its figures `lib.sei.figures`, its retrieval `lib.sei.retrieval`.

    agents = train_agents(out_root, recipe, data, templates, ...)      # four fine-tuned agents (cached)
    rows, items = evaluate_agents(agents, data, templates, emb, ...)  # Table 3: held-out scores beside the
                                                                       #   nearest-training-meme baseline
    ex = retrieve_exemplars(dataset, memes, train_split, test_split, ...)   # ranked exemplar pools
    plans = plan_settings(settings, queries, pool, ...)               # which exemplars each prompt shows
    silver = make_silver(pool, needs, agents, ...)                    # silver captions, explanations, interventions
    result, preds = evaluate_setting(chat, setting, queries, pool, plan, silver, ...)   # lib.sei.fewshot, per setting
    claims, cold = claim_frame(preds, main_name, retriever, spread=True)       # each claim's paired test
"""
from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lib.sei import fewshot as sei, retrieval
from lib.sei.agents import (AGENTS, LABEL_WORDS, AgentExample, AgentRecipe, agent_chat, build_agent_data,
                        nearest_train_baseline, norm_id, prompt_templates, run_agent, train_agent)
from lib.compendium.artifacts import read_jsonl, require, stage_dir, write_bytes, write_json
from lib.models.chat import ResponseCache, default_cache_path
from lib.data.prep import load_prepared
from lib.evaluation.metrics import interval_keys, run_spread
from lib.evaluation import plan as analysis
from lib.evaluation.claims import claim_metric_keys, cold_run_metric_keys, cold_runs_of, plan_rows, table
from lib.compendium.params import is_paper
from lib.sei.fewshot import Meme, Prediction, subgroup
from lib.evaluation.textmetrics import pair_semsim, score_texts
from lib.sei.analysis import exemplar_label_following, results_frame
from lib.sei.analysis import PAPER_TABLE3



# ----------------------------------------------------------------------------- data
def memeworld_types(root: str | Path) -> dict[str, str]:
    """MemeWorld's SMI interaction type per meme id (empty for real data)."""
    p = Path(root) / "memeworld.jsonl"
    if not p.exists():
        return {}
    return {norm_id(r["id"]): r["type"] for r in read_jsonl(p)}


def to_memes(records: Sequence[Any], types: dict[str, str] | None = None) -> list[Meme]:
    types = types or {}
    return [Meme(norm_id(r.id), Path(r.img_path), r.text or "", r.label, split=r.split, type=types.get(norm_id(r.id)))
            for r in records]


# ----------------------------------------------------------------------------- agents
def train_agents(out_root: Path, recipe: AgentRecipe, data: dict[str, list[AgentExample]], templates: dict[str, str],
                 per_agent: dict[str, dict[str, Any]] | None = None, progress: bool = True) -> dict[str, dict[str, Any]]:
    """Fine-tune every agent (cached on its inputs); per_agent overrides recipe fields per agent."""
    out = {}
    for a in AGENTS:
        r = replace(recipe, **(per_agent or {}).get(a, {}))
        rec = train_agent(data[a], Path(out_root) / a, r, templates[a], progress=progress)
        out[a] = {**rec, "dir": str(Path(out_root) / a)}
    return out


def evaluate_agents(agents: dict[str, dict[str, Any]], data: dict[str, list[AgentExample]], templates: dict[str, str],
                    emb: dict[str, np.ndarray], cache, eval_n: int = 0, max_new_tokens: int = 100, seed: int = 0,
                    intervention_input: str = "generated", semsim_model: str = "minilm", bertscore=None,
                    batch_size: int = 32, progress: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Table 3: each agent on its held-out examples (a seeded subset of eval_n), beside the
    nearest-training-meme baseline. The intervention agent reads the commonsense agent's output
    (`generated`, as deployed) or the gold commonsense (`gold`). Returns the table's rows and one item per
    example (agent, id, the agent's text, the baseline's, the references, the answer's status: what
    table3_rows scores, kept as agent_outputs.jsonl)."""
    rng = random.Random(seed)
    chats = {a: agent_chat(agents[a]["dir"], cache, batch_size=batch_size) for a in AGENTS}
    held, outputs, items = {}, {}, []
    for a in AGENTS:
        test = [e for e in data[a] if e.split == "test"]
        if eval_n and len(test) > eval_n:
            test = sorted(rng.sample(test, eval_n), key=lambda e: e.id)
        held[a] = test
    # the intervention agent is evaluated on the commonsense agent's memes: generate commonsense first
    for a in AGENTS:
        test = held[a]
        its = [(e.img_path, e.inputs) for e in test]
        if a == "intervention" and intervention_input == "generated":
            cs = dict(zip([e.id for e in held["commonsense"]], outputs.get("commonsense", [])))
            missing = [e for e in test if e.id not in cs]
            if missing:
                extra = run_agent(chats["commonsense"], templates["commonsense"],
                                  [(e.img_path, {"ocr": e.inputs["ocr"]}) for e in missing], max_new_tokens,
                                  progress=progress)
                cs.update({e.id: r.text for e, r in zip(missing, extra)})
            its = [(e.img_path, {**e.inputs, "commonsense": cs[e.id]}) for e in test]
        res = run_agent(chats[a], templates[a], its, max_new_tokens, desc=a, progress=progress)
        outputs[a] = [r.text for r in res]
        base = nearest_train_baseline(test, [e for e in data[a] if e.split == "train"], emb)
        items += [{"agent": a, "id": e.id, "output": r.text, "baseline": b, "references": list(e.references),
                   "gold": e.target, "status": r.status} for e, r, b in zip(test, res, base)]
    return table3_rows(items, semsim_model, bertscore), items


def table3_rows(items: Sequence[dict[str, Any]], semsim_model: str = "minilm", bertscore=None) -> list[dict[str, Any]]:
    """Table 3's rows from the per-example items of evaluate_agents: each agent's scores against the
    references beside the nearest-training-meme baseline's, whether it learned more than copying (both
    ROUGE-L and semantic similarity above the baseline's), and three examples."""
    rows = []
    for a in dict.fromkeys(x["agent"] for x in items):
        its = [x for x in items if x["agent"] == a]
        refs = [x["references"] for x in its]
        s = score_texts([x["output"] for x in its], refs, semsim_model, bertscore)
        b = score_texts([x["baseline"] for x in its], refs, semsim_model, bertscore)
        rows.append({"agent": a, "n": len(its), "rouge_l": s["rouge_l"], "semsim": s["semsim"],
                     "bertscore_f1": s["bertscore_f1"], "baseline_rouge_l": b["rouge_l"],
                     "baseline_semsim": b["semsim"], "baseline_bertscore_f1": b["bertscore_f1"],
                     "n_failed": sum(x["status"] != "ok" for x in its),
                     "learned": bool(s["rouge_l"] > b["rouge_l"] and s["semsim"] > b["semsim"]),
                     "examples": [{"id": x["id"], "gold": x["gold"], "agent": x["output"], "nearest_train": x["baseline"]}
                                  for x in its[:3]]})
    return rows


def table3_frame(rows: Sequence[dict[str, Any]], profile: str, bertscore_label: str = "BERTScore-F1"):
    import pandas as pd
    df = pd.DataFrame([{k: v for k, v in r.items() if k != "examples"} for r in rows]).set_index("agent")
    if is_paper(profile):
        for a, (data, n, rl, ss, bs) in PAPER_TABLE3.items():
            if a in df.index:
                df.loc[a, ["paper_data", "paper_n", "paper_rouge_l", "paper_semsim", "paper_bertscore_f1"]] = \
                    [data, n, rl, ss, bs]
    return df.rename(columns={"bertscore_f1": bertscore_label, "baseline_bertscore_f1": f"baseline {bertscore_label}"})


# ----------------------------------------------------------------------------- silver data
def make_silver(pool: Sequence[Meme], needs: tuple[set[int], set[tuple[int, int]], set[int]],
                agents: dict[str, dict[str, Any]], templates: dict[str, str], cache, max_new_tokens: int = 100,
                batch_size: int = 32, progress: bool = True) -> dict[str, Any]:
    """Agent outputs for the exemplars a run needs: captions, label-aware explanations, and for the
    memes shown as hateful a commonsense text, then an intervention from it."""
    caps, expl, iv = needs
    caps, expl, iv = sorted(caps), sorted(expl), sorted(iv)
    chats = {a: agent_chat(agents[a]["dir"], cache, batch_size=batch_size) for a in AGENTS}
    c = run_agent(chats["captioner"], templates["captioner"], [(pool[j].img_path, {"ocr": pool[j].ocr}) for j in caps],
                  max_new_tokens, desc="silver captions", progress=progress)
    e = run_agent(chats["explainer"], templates["explainer"],
                  [(pool[j].img_path, {"ocr": pool[j].ocr, "label": LABEL_WORDS[lab]}) for j, lab in expl],
                  max_new_tokens, desc="silver explanations", progress=progress)
    cs = run_agent(chats["commonsense"], templates["commonsense"],
                   [(pool[j].img_path, {"ocr": pool[j].ocr}) for j in iv], max_new_tokens, desc="silver commonsense",
                   progress=progress)
    i = run_agent(chats["intervention"], templates["intervention"],
                  [(pool[j].img_path, {"ocr": pool[j].ocr, "commonsense": r.text}) for j, r in zip(iv, cs)],
                  max_new_tokens, desc="silver interventions", progress=progress)
    bad = [r for r in c + e + cs + i if r.status != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} agent calls failed while writing silver data (first: {bad[0].error})")
    return {"captions": {j: r.text for j, r in zip(caps, c)}, "explanations": {k: r.text for k, r in zip(expl, e)},
            "commonsense": {j: r.text for j, r in zip(iv, cs)}, "interventions": {j: r.text for j, r in zip(iv, i)}}


def caption_queries(queries: Sequence[Meme], agents: dict[str, dict[str, Any]], templates: dict[str, str], cache,
                    max_new_tokens: int = 100, batch_size: int = 32, progress: bool = True) -> list[str]:
    """The captioning agent's caption of each test meme (the paper's test-caption source)."""
    chat = agent_chat(agents["captioner"]["dir"], cache, batch_size=batch_size)
    res = run_agent(chat, templates["captioner"], [(q.img_path, {"ocr": q.ocr}) for q in queries], max_new_tokens,
                    desc="test captions", progress=progress)
    bad = [r for r in res if r.status != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} test captions failed (first: {bad[0].error})")
    return [r.text for r in res]


def gold_exemplar_texts(pool: Sequence[Meme], silver: dict[str, Any], data: dict[str, list[AgentExample]]
                        ) -> tuple[dict[str, Any], int]:
    """`exemplar_texts: gold`: the dataset's own caption, explanation (for the gold label only) and
    intervention replace the agents' where they exist; returns the new texts and how many changed."""
    by = {a: {e.id: e for e in v} for a, v in data.items()}
    out = {k: dict(v) for k, v in silver.items()}
    n = 0
    for j in list(out["captions"]):
        e = by["captioner"].get(pool[j].id)
        if e:
            out["captions"][j] = e.target
            n += 1
    for (j, lab) in list(out["explanations"]):
        e = by["explainer"].get(pool[j].id)
        if e and lab == pool[j].label:
            out["explanations"][(j, lab)] = e.target
            n += 1
    for j in list(out["interventions"]):
        e = by["intervention"].get(pool[j].id)
        if e:
            out["interventions"][j] = e.target
            n += 1
    return out, n


def gold_refs(records: Sequence[Any], kind: str, ids: set[str] | None) -> dict[str, list[str]]:
    """Gold explanations (HatReD-style records: every reasoning) or interventions (MemeSense) by
    meme id, restricted to `ids` when given."""
    out: dict[str, list[str]] = {}
    for r in records:
        i = norm_id(r.id)
        if ids is not None and i not in ids:
            continue
        texts = list(getattr(r, "reasonings", None) or []) if kind == "explanation" else \
            [getattr(r, "intervention", "")]
        texts = [t for t in texts if t]
        if texts:
            out.setdefault(i, []).extend(texts)
    return out


def coherence_frame(preds: Sequence[Prediction], semsim_model: str = "minilm"):
    """Semantic similarity between each meme's explanation and its own intervention (cp, wp)."""
    import pandas as pd
    both = [p for p in preds if p.explanation and p.intervention and subgroup(p.gold, p.label) in ("cp", "wp")]
    sims = pair_semsim([p.explanation for p in both], [p.intervention for p in both], semsim_model)
    return pd.DataFrame({"id": [p.id for p in both], "setting": [p.setting for p in both],
                         "subgroup": [subgroup(p.gold, p.label) for p in both], "coherence": sims})


def silver_records(pool: Sequence[Meme], silver: dict[str, Any]) -> list[dict[str, Any]]:
    """The silver data as one JSON record per exemplar meme (what silver_<dataset>.jsonl holds)."""
    out = []
    for j in sorted(silver["captions"]):
        m = pool[j]
        out.append({"id": m.id, "label": m.label, "caption": silver["captions"][j],
                    "explanation": {("hateful" if lab else "non-hateful"): t
                                    for (jj, lab), t in silver["explanations"].items() if jj == j},
                    "commonsense": silver["commonsense"].get(j), "intervention": silver["interventions"].get(j)})
    return out


# ----------------------------------------------------------------------------- notebook 06
#: the parameters of notebook 04 that rebuild its moderator (written to its settings.json)
def evaluated(result: dict[str, Any]) -> int | None:
    """How many memes a setting's accuracy is over: every status counted (an unparseable answer
    is a wrong one, not a missing one); `n` where no status is counted."""
    total = sum(int(result.get(f"n_{s}", 0)) for s in sei.STATUSES)
    return total or result.get("n")




SETTINGS_KEYS = ("datasets", "train_split", "agent_base", "agent_recipe", "agent_overrides", "agent_prompt_dir",
                 "agent_max_new_tokens", "retrievers", "shots", "order", "controls", "models", "serve_preset",
                 "images", "prompt_dir", "temperature", "max_new_tokens", "parser", "seed", "answer_format",
                 "string_max_length", "knn_n", "eval_n", "eval_balance", "cold_runs", "semsim_model", "bertscore",
                 "rouge_stemmer", "explanation_refs", "intervention_refs", "ci_resamples", "ci_method", "adapted")


class FewShotModerator:
    """Notebook 04's few-shot moderator rebuilt from 04's declared artifacts alone: the settings it
    ran with (`settings.json`, SETTINGS_KEYS) and its fine-tuned agents (reused, never
    retrained), to moderate memes 04 did not
    evaluate: notebook 06's common memes and their prompt-injected copies. The exemplar pool, the
    retriever, the silver texts, the prompt, the model and the parser are 04's; every call goes
    through the response cache.

        fs = FewShotModerator(profile, chat, out_dir)
        preds = fs.predict(memes, "memeworld-clip/4")          # a setting name from notebook 04
    """

    def __init__(self, profile: str, chat, out_dir: Path, section: dict[str, Any] | None = None,
                 progress: bool = False):
        p = section or json.loads(require(profile, "sei_settings", "lib.sei.report.FewShotModerator").read_text())
        nb = "notebooks/04_few_shot.ipynb"
        self.p, self.chat, self.out_dir, self.progress = p, chat, Path(out_dir), progress
        self.ds = next(iter(p["datasets"]))
        self.definitions = p["datasets"][self.ds]["definitions"]
        self.cache = ResponseCache(default_cache_path(profile))
        recs = {n: load_prepared(profile, n, nb).records for n in ["memecap", "hatred", "memesense", self.ds]}
        self.types = memeworld_types(Path(recs[self.ds][0].img_path).parent.parent) if recs[self.ds] else {}
        self.pool = [m for m in to_memes(recs[self.ds], self.types) if m.split == p["train_split"]]
        self.agent_tpl = prompt_templates(p["agent_prompt_dir"])
        data = build_agent_data(recs["memecap"], recs["hatred"], recs["memesense"], recs[self.ds])
        recipe = AgentRecipe(base=p["agent_base"], prompt_dir=p["agent_prompt_dir"], seed=p["seed"], **p["agent_recipe"])
        self.stage04 = stage_dir(profile, "04_few_shot")
        self.agents = train_agents(self.stage04 / "agents", recipe, data, self.agent_tpl,
                                   p["agent_overrides"], progress=progress)
        self.settings = {s.name: s for s in sei.parse_settings(p["controls"], p["retrievers"], p["shots"],
                                                               p.get("answer_format", "free_text"))}
        self.tpl = sei.SeiTemplates.load(p["prompt_dir"])

    def main_setting(self) -> str:
        """The setting notebook 04 reports as its main row (first retriever, 4 shots or the largest n)."""
        return sei.main_setting_name(self.p["retrievers"], self.p["shots"])

    def predict(self, memes: Sequence[Meme], setting: str) -> list[Prediction]:
        """Few-shot (or zero-shot) predictions for `memes` (sei.Meme; their caption is written here
        by 04's captioning agent) under one of 04's settings."""
        if setting not in self.settings:
            raise KeyError(f"no few-shot setting {setting!r}; notebook 04's settings: {', '.join(self.settings)}")
        s = self.settings[setting]
        ranked = {}
        if s.n and s.retriever:
            mine, theirs = (retrieval.embeddings_file(d, s.retriever) for d in (self.out_dir, self.stage04))
            if not mine.exists() and theirs.exists():       # start from 04's embeddings: only new memes are embedded
                write_bytes(mine, theirs.read_bytes())
            emb = retrieval.embed_memes(s.retriever, list(self.pool) + list(memes), mine, progress=self.progress)
            ranked[s.retriever] = retrieval.rank(emb, [m.id for m in memes], [m.id for m in self.pool], s.n)[0]
        plan = sei.plan_exemplars(s, memes, self.pool, ranked, self.p["order"], self.p["seed"])
        silver = make_silver(self.pool, sei.silver_needs([plan]), self.agents, self.agent_tpl, self.cache,
                             self.p["agent_max_new_tokens"], progress=self.progress)
        caps = caption_queries(memes, self.agents, self.agent_tpl, self.cache, self.p["agent_max_new_tokens"],
                               progress=self.progress)
        queries = [replace(m, caption=c) for m, c in zip(memes, caps)]
        preds, _ = sei.run_setting(self.chat, s, queries, self.pool, plan, silver, self.tpl, self.definitions,
                                   self.p["max_new_tokens"], self.p["temperature"], self.p["images"],
                                   parser=self.p["parser"], progress=self.progress,
                                   string_max_length=self.p.get("string_max_length"))
        return preds


# ----------------------------------------------------------------------------- notebook 04's steps
def retrieve_exemplars(dataset: str, memes: Sequence[Meme], train_split: str, test_split: str, eval_n: int,
                       eval_seed: int, retrievers: Sequence[str], emb: dict[str, dict[str, np.ndarray]],
                       ns: Sequence[int], out_dir: Path, balance: str = "label", whole_ranking: bool = False
                       ) -> tuple[list[Meme], list[Meme], dict[str, np.ndarray], list[dict[str, Any]], str]:
    """One dataset's exemplar pool (the train split), its balanced evaluation queries, the pool
    ranked for every query by each retriever (written as exemplars_<dataset>_<retriever>.json,
    with similarities) and the retrieval quality at each n in `ns`. `emb`: retriever -> the
    embeddings already computed; memes missing from them are embedded (cached per encoder).
    `whole_ranking`: every pool meme ranked (a `same_type` setting picks the nearest of the query's type;
    the file still lists the first max(ns)). Returns (pool, queries, ranked, quality rows, a summary line)."""
    pool = [m for m in memes if m.split == train_split]
    test_all = [m for m in memes if m.split == test_split]
    queries = sei.balanced_subset(test_all, eval_n, eval_seed, balance)
    ranked, rows = {}, []
    for r in retrievers:
        e = emb[r] if all(m.id in emb[r] for m in pool + queries) else \
            retrieval.embed_memes(r, pool + queries, retrieval.embeddings_file(out_dir, r))
        idx, sims = retrieval.rank(e, [m.id for m in queries], [m.id for m in pool], len(pool) if whole_ranking else max(ns))
        ranked[r] = idx
        write_json(out_dir / f"exemplars_{dataset}_{r.replace('/', '_')}.json",
                   {q.id: [[pool[j].id, round(float(s), 6)] for j, s in zip(row[:max(ns)], srow[:max(ns)])]
                    for q, row, srow in zip(queries, idx, sims)})
        rows += [{"dataset": dataset, "retriever": r, **retrieval.retrieval_quality(idx[:, :n], pool, queries)}
                 for n in sorted(set(ns))]
    line = (f"{dataset}: pool {len(pool)} {train_split} memes; {len(queries)} of {len(test_all)} "
            f"{test_split} memes ({sum(q.label for q in queries)} hateful"
            + (f"; {len({q.type for q in queries})} types, {dict(sorted(Counter(q.type for q in queries).items()))}"
               if balance == "type" else "") + ")")
    return pool, queries, ranked, rows, line


def evaluate_setting(chat, setting, queries: Sequence[Meme], pool: Sequence[Meme], plan, silver: dict[str, Any],
                     tpl, definitions: str, gold: dict[str, dict[str, list[str]]], generation: dict[str, Any],
                     scoring: dict[str, Any]) -> tuple[dict[str, Any], list[Prediction]]:
    """One few-shot setting on one dataset: the predictions, and their classification, cost,
    explanation / intervention scores against `gold` ({"explanation": ..., "intervention": ...})
    and how often the answer follows the exemplars' labels. `generation`: max_new_tokens,
    temperature, images, parser; `scoring`: semsim_model, bertscore, stemmer."""
    preds, cost = sei.run_setting(chat, setting, queries, pool, plan, silver, tpl, definitions, **generation)
    res = {**sei.classification(preds), **cost}
    res.update(sei.generation_scores(preds, gold["explanation"], gold["intervention"], **scoring))
    res.update(exemplar_label_following(preds))
    return res, preds


def plan_settings(settings: Sequence[sei.Setting], queries: Sequence[Meme], pool: Sequence[Meme],
                  ranked: dict[str, np.ndarray], order: str, seed: int, eval_seed: int, balance: str,
                  population: Sequence[Meme] | None = None
                  ) -> tuple[dict[str, dict[str, list[tuple[int, int]]]], dict[str, list[Meme]]]:
    """Every setting's exemplar plan and the evaluation memes it runs on: all of `queries`, or for a
    setting with `eval_n` their balanced subset (sei.setting_queries; `population`: the test split `queries` were
    drawn from, so that a subset is the draw a smaller evaluation set would be). Plans are drawn over all
    queries (a query's exemplars never depend on which others run) and kept for the setting's own
    memes, so no silver text is written for an exemplar no prompt shows."""
    plans, runs_on = {}, {}
    for s in settings:
        runs_on[s.name] = sei.setting_queries(s, queries, eval_seed, balance, population)
        ids = {q.id for q in runs_on[s.name]}
        plans[s.name] = {i: v for i, v in sei.plan_exemplars(s, queries, pool, ranked, order, seed).items() if i in ids}
    return plans, runs_on


def knn_predictions(ranked: np.ndarray, pool: Sequence[Meme], queries: Sequence[Meme]) -> list[Prediction]:
    """The label-vote control as predictions: each query's label is the majority of its retrieved
    exemplars' gold labels (no model call)."""
    return [Prediction(q.id, q.label, "knn_vote", "ok", int(v), "", "", False, False, [], [])
            for q, v in zip(queries, retrieval.knn_vote(ranked, pool))]


def knn_result(ranked: np.ndarray, pool: Sequence[Meme], queries: Sequence[Meme]) -> dict[str, Any]:
    """The label-vote control's classification (no model call)."""
    return {**sei.classification(knn_predictions(ranked, pool, queries)), "calls": 0}


#: what each planned claim of notebook 04 (params/analysis/plan.yaml) isolates; the plan holds the arms ("<main>"-free
#: names: the paper's retriever at 4 shots is memeworld-clip/4), units, n, controls and baselines
FEWSHOT_WHAT = {
    "retrieved_vs_random": "the same prompt and n, with exemplars chosen by image similarity or at random",
    "zero_shot": "four retrieved exemplars against the same prompt with none",
    "shuffled_labels": "the same exemplars shown with their gold labels or labels redrawn at the base rate",
    "adds_to_vote": "the model's answer against the majority label of the same retrieved exemplars (no model)",
    "explanations": "the same exemplars and labels, shown with or without their silver explanations and interventions",
    "four_vs_two": "the same retriever at n = 4 and n = 2",
    "text_retriever": "the same prompt and n, with exemplars chosen by image and meme-text similarity or at random",
}


#: what follows each claim's name in the adapted moderator's claims table (notebook 04, claims_adapted.csv)
ADAPTED_MODERATOR_TAG = " (adapted moderator)"


def prediction_correct(preds: Sequence[Prediction]) -> dict[str, bool]:
    """Meme id -> right or wrong; an answer with no label (unparseable, refused) is wrong, as the
    accuracy counts it."""
    return {p.id: p.status == "ok" and p.label in (0, 1) and p.label == p.gold for p in preds}


def claim_frame(preds: dict[str, Sequence[Prediction]], main_name: str, retriever: str,
                confidence: float = 0.95, spread: bool = False, others: Sequence[str] = (),
                preconditions: dict[str, bool] | None = None, tag: str = "", plan=None,
                first_items: Sequence[str] | None = None, knn: dict[str, Sequence[Prediction]] | None = None):
    """Notebook 04's claims table: each claim the analysis plan (params/analysis/plan.yaml) gives this table (the
    adapted moderator's when `tag` is ADAPTED_MODERATOR_TAG), tested with its unit's test on its first n memes
    (`first_items`: the memes the run first answered, before the evaluation set grew; the grown set is the plan's
    second look) by lib.evaluation.claims.plan_rows: its control is the same-type exemplars' setting against the
    claim's B arm, its baseline the majority label of the claim's own exemplars (the kNN vote of its retriever:
    `knn`, retriever -> predictions; "knn_vote" in `preds` is the main retriever's). `preds`: setting name ->
    predictions. `preconditions`: retriever -> whether its exemplars are informative neighbours. `spread`: also
    return the per-run rows (cold_runs.csv). `others` is kept for the callers; the plan names the retrievers."""
    import pandas as pd
    plan = plan or analysis.load()
    table_name = "claims_adapted.csv" if tag == ADAPTED_MODERATOR_TAG else "claims.csv"
    truth = {p.id: p.gold for v in preds.values() for p in v}
    answers = {k: {p.id: p.label for p in v} for k, v in preds.items()}
    correct = {k: prediction_correct(v) for k, v in preds.items()}
    knn_correct = {r: prediction_correct(v) for r, v in (knn or {}).items()}
    first = set(first_items) if first_items is not None else None
    rows = []
    for c in plan.of("04_few_shot", table_name):
        base = c.a.rsplit("/", 1)[0]
        status = (preconditions or {}).get(base)
        pre = {c.id: "met" if status else "not met"} if status is not None else {}
        # the claim's baseline is its own retriever's kNN vote; a retriever whose exemplars are missing has none
        # (None: "knn_vote did not run"), never the main retriever's vote under its name
        extra = {"knn_vote": knn_correct.get(base)} if base != retriever else None
        names = {"memeworld-clip/4": main_name} if c.a == "memeworld-clip/4" else {}
        rows += plan_rows([c], correct, truth, plan_digest=plan.digest, alpha=plan.alpha, power=plan.power,
                          family_sizes=plan.family_sizes(),
                          confidence=confidence, answers=answers, first_items=first, preconditions=pre,
                          arm_names=names, extra_baselines=extra,
                          what={c.id: FEWSHOT_WHAT.get(c.id.split(".")[1], "")})
    claims = table(rows)
    if not spread:
        return claims
    runs = []
    for r in rows:
        if r["role"] == "primary" and r["runs"] and int(r["runs"]) > 1:
            ra, rb = cold_runs_of(r["A"], list(correct)), cold_runs_of(r["B"], list(correct))
            k = min(len(ra), len(rb))
            ids = set.intersection(*(set(correct[x]) for x in (*ra[:k], *rb[:k])))
            if first is not None:
                ids &= first
            runs += [{"claim": r["claim"], "A": r["A"], "B": r["B"], **x}
                     for x in run_spread([{i: correct[x][i] for i in ids} for x in ra[:k]],
                                         [{i: correct[x][i] for i in ids} for x in rb[:k]], truth, confidence)]
    return claims, pd.DataFrame(runs)


def claim_metrics(claims) -> dict[str, Any]:
    """metrics.json keys of each claim row: claim_<A>_vs_<B>_{n, acc_a, acc_b, p, majority}."""
    return claim_metric_keys([] if claims is None else claims.to_dict("records"))


#: notebook 04's Table 2 columns
TABLE2_COLUMNS = ("acc", "macro_f1", "n", "n_unparseable", "n_refused", "support", "pred_hateful_share",
                  "follows_majority", "expl_rouge_l", "expl_semsim", "expl_bertscore_f1", "expl_n", "int_rouge_l",
                  "int_semsim", "int_n", "prompt_tokens", "completion_tokens")   # no call count or time: a replay
                                                                                 # finds what a cold run found


def table2_view(results: dict[str, dict[str, Any]], bertscore_label: str):
    """Every setting's row with TABLE2_COLUMNS, the BERTScore column named by its model."""
    return results_frame(results).reindex(columns=list(TABLE2_COLUMNS)).rename(
        columns={"expl_bertscore_f1": f"expl {bertscore_label}"})


def stage_metrics(results: dict[str, dict[str, Any]], row, main_name: str, majority_acc: float, quality,
                  retriever: str, knn_n: int, dataset: str, agent_rows: Sequence[dict[str, Any]],
                  bertscore_proxy: bool, rerun_calls: int, claims=None, cold=None) -> dict[str, Any]:
    """Notebook 04's metrics.json: the main setting's classification and generation scores, the
    controls' accuracies (zero-shot, random and shuffled-label exemplars, the other answer format,
    label vote) with Wilson intervals and each control's n, the claims' paired tests (claim_frame),
    the retrieval's label (and MemeWorld type) agreement against its base rate (`quality`: the retrieval table), the agents'
    scores, the cost, and the accuracy of every other setting. `row(name)`: a setting's results;
    `cold`: claim_frame's per-run rows (the cold runs' spread)."""
    main = row(main_name)
    q = quality[(quality.retriever == retriever) & (quality.n == knn_n) & (quality.dataset == dataset)]
    m: dict[str, Any] = {
        "acc": main["acc"], "macro_f1": main["macro_f1"], "acc_zero_shot": row("zero_shot").get("acc"),
        "acc_random_exemplars": row("random_4").get("acc"), "acc_shuffled_labels": row("shuffled_labels_4").get("acc"),
        "acc_structured": row("structured_4").get("acc"), "acc_free_text": row("free_text_4").get("acc"),
        "acc_knn_vote": row("knn_vote")["acc"],
        "majority_acc": majority_acc, "retrieval_label_agreement": float(q["label_agreement"].iloc[0]),
        "retrieval_label_base_rate": float(q["label_base_rate"].iloc[0]),
        "n_eval": main["n"], "n_unparseable": main["n_unparseable"], "n_refused": main["n_refused"],
        "support": main["support"], "follows_majority": main["follows_majority"], "expl_rouge_l": main["expl_rouge_l"], "expl_semsim": main["expl_semsim"],
        "expl_bertscore_f1_proxy" if bertscore_proxy else "expl_bertscore_f1": main["expl_bertscore_f1"],
        "int_rouge_l": main["int_rouge_l"], "int_semsim": main["int_semsim"],
        "calls": int(sum(r.get("calls", 0) for r in results.values())),
        "prompt_tokens": int(sum(r.get("prompt_tokens", 0) for r in results.values())),
        "completion_tokens": int(sum(r.get("completion_tokens", 0) for r in results.values())),
        "few_shot_wall_s": float(sum(r.get("wall_s", 0) for r in results.values())),
        "few_shot_model_latency_s": float(sum(r.get("model_latency_s", 0) for r in results.values())),
        "rerun_calls": rerun_calls}
    for key, name in (("acc", main_name), ("acc_zero_shot", "zero_shot"), ("acc_random_exemplars", "random_4"),
                      ("acc_shuffled_labels", "shuffled_labels_4"), ("acc_structured", "structured_4"),
                      ("acc_free_text", "free_text_4"), ("acc_knn_vote", "knn_vote")):
        if m[key] is None:                                                # a control this profile does not run
            del m[key]
            continue
        m.update(interval_keys(key, m[key], evaluated(row(name))))        # Wilson: n is tens of memes
        if key != "acc":
            m[f"n_{key.removeprefix('acc_')}"] = evaluated(row(name))
    m.update(claim_metrics(claims))
    m.update(cold_run_metric_keys([] if cold is None or not len(cold) else cold.to_dict("records")))
    if "type_agreement" in quality:
        m["retrieval_type_agreement"] = float(q["type_agreement"].iloc[0])
        m["retrieval_type_base_rate"] = float(q["type_base_rate"].iloc[0])
    for r in agent_rows:
        a = r["agent"]
        m.update({f"agent_{a}_rouge_l": r["rouge_l"], f"agent_{a}_semsim": r["semsim"],
                  f"agent_{a}_bertscore_f1": r["bertscore_f1"], f"agent_{a}_baseline_rouge_l": r["baseline_rouge_l"],
                  f"agent_{a}_baseline_semsim": r["baseline_semsim"], f"agent_{a}_n": r["n"],
                  f"agent_{a}_learned": r["learned"]})
    for k, r in results.items():
        if k != main_name and "acc" in r:
            m[f"acc_{k.replace('/', '_').replace(':', '_')}"] = r["acc"]
    return {k: (float(v) if isinstance(v, (np.floating, float)) else v) for k, v in m.items()}


# ----------------------------------------------------------------------------- the adapted moderator (lib.sei.adapt)
#: predictions_adapted.jsonl's roles: the adapter trained on the gold labels, and its shuffled-label control
ADAPTED_ROLES = {"model": "adapted", "control": "adapted_control"}


def adapted_metrics(preds: dict[str, dict[str, Sequence[Prediction]]], training: dict[str, dict[str, Any]],
                    claims=None) -> dict[str, Any]:
    """metrics.json keys of the adapted moderator (`preds`: role -> setting -> predictions): each setting's
    accuracy (Wilson interval, n) and hateful share per role, the adapters' training examples, and the claims
    re-tested on the adapted moderator (`claims`: claim_frame's table) as adapted_claim_... keys."""
    m: dict[str, Any] = {}
    for role, by in preds.items():
        tag = ADAPTED_ROLES[role]
        for name, ps in by.items():
            c = sei.classification(ps)
            key = f"{tag}_{name.replace('/', '_')}_acc"
            m[key] = c["acc"]
            m.update(interval_keys(key, c["acc"], evaluated(c)))
            m[f"{tag}_{name.replace('/', '_')}_pred_hateful_share"] = c["pred_hateful_share"]
        if training.get(role):
            m[f"{tag}_n_train"] = int(training[role]["n_examples"])
    m.update({f"adapted_{k}": v for k, v in claim_metrics(claims).items()})
    return m
