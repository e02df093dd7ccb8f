"""Notebook 02 (TRACE) collected: the runs a profile asks for (`TraceRuns`), the ablation and seed
tables, the caption-benefit test, the MultiOFF runs and the stage metrics.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from lib.models.encoders import load_encoder
from lib.evaluation.metrics import paired_accuracy_test, per_type_accuracy
from lib.trace.model import TrainConfig, config_diff
from lib.trace.features import FeatureCache, MemeBatchData
from lib.trace.runs import run_config, run_variant, run_variants, shared_cache, split_rows, variant_name


# ----------------------------------------------------------------------------- notebook 02's runs
@dataclass
class TraceRuns:
    """Notebook 02's runs of one dataset: their configs from the profile section, the feature
    caches they share (one per backbone and lowest unfrozen layer, built from a fresh encoder),
    training in worker processes and collection of the results (finished runs are read back)."""
    section: dict[str, Any]
    data: MemeBatchData
    src: Path
    columns: Sequence[str]
    runs_dir: Path
    dataset: str = "fhm"
    max_memes: int = 0
    seed: int = 0
    workers: int = 1
    device: str | None = None
    caches: dict[Any, FeatureCache] = field(default_factory=dict)

    def backbone(self) -> str:
        """The dataset's default backbone (MultiOFF: its recipe's)."""
        return run_config(self.section, None, self.dataset)[0]

    def config(self, backbone: str | None = None, **overrides) -> TrainConfig:
        return run_config(self.section, backbone, self.dataset, **overrides)[1]

    def cache_for(self, backbone: str, cfg: TrainConfig, encoder) -> FeatureCache:
        return shared_cache(self.caches, self.data, backbone, cfg, encoder)

    def job(self, backbone: str | None = None, overrides: dict[str, Any] | None = None,
            tag: str = "") -> tuple[Path, str, TrainConfig]:
        """(run folder, backbone, TrainConfig) of one run."""
        backbone = backbone or self.backbone()
        cfg = self.config(backbone, **(overrides or {}))
        return self.runs_dir / variant_name(cfg, backbone, self.dataset, tag=tag), backbone, cfg

    def train(self, jobs: Sequence[tuple[Path, str, TrainConfig]]) -> list[dict[str, Any]]:
        """Train every job not finished yet, `workers` processes at a time; the results of all of them."""
        return run_variants(jobs, self.src, self.columns, self.max_memes, self.seed, self.workers, self.device)

    def collect(self, job: tuple[Path, str, TrainConfig], types: dict[str, str] | None = None,
                per_type_split: str = "test_seen") -> dict[str, Any]:
        """One run (trained here if it is not finished), with accuracy per interaction type of
        `per_type_split` when MemeWorld's `types` are known."""
        run_dir, backbone, cfg = job
        r = run_variant(run_dir, self.data, backbone, cfg, lambda: load_encoder(backbone, device=self.device),
                        lambda e: self.cache_for(backbone, cfg, e), progress=False)
        r["eval"]["per_type"] = per_type_accuracy([p for p in r["eval"]["predictions"] if p["split"] == per_type_split],
                                                  types or {}, with_n=True)
        return r


def ablation_variants(loss_configs: Sequence[str], baselines: Sequence[str], extra_variants: dict[str, dict[str, Any]],
                      backbones: Sequence[str]) -> dict[str, tuple[str, dict[str, Any], str]]:
    """Notebook 02's FHM runs, name -> (backbone, TrainConfig overrides, folder tag): each loss
    configuration, the unimodal baselines, the named extra variants (tagged by the text in their
    name's parentheses) and the default loss on every further backbone."""
    main, default = backbones[0], loss_configs[0]
    out = {lc: (main, {"loss_config": lc}, "") for lc in loss_configs}
    out.update({f"{m}_only": (main, {"loss_config": default, "modality": m}, "") for m in baselines})
    for name, over in extra_variants.items():
        tag = "".join(ch if ch.isalnum() else "_" for ch in name.split("(", 1)[-1].rstrip(")")).strip("_").lower()
        out[name] = (main, {"loss_config": default, **over}, tag)
    out.update({f"{default}@{b}": (b, {"loss_config": default}, "") for b in backbones[1:]})
    return out


def predictions_file(name: str, tag: str = "") -> str:
    """The csv a variant's predictions are written to (notebook 06 reads them by this name)."""
    return f"predictions_{name.split(' ')[0].replace('+', '_').replace('@', '_')}{'_' + tag if tag else ''}.csv"


def run_summary(name: str, r: dict[str, Any], split: str = "test_seen") -> str:
    """One printed line per run: epochs, validation AUROC, test numbers (not whether this run trained it or read it
    back, nor its seconds: the saved notebook says what a run found, the same whether it trained or replayed)."""
    ts = r["eval"]["splits"][split]
    return (f"{name:20s} epochs {r['fit']['epochs_run']:2d} "
            f"(best {r['fit']['best_epoch']:2d}) | val AUROC {r['fit']['best_val']:.3f} | {split} acc {ts['accuracy']:.3f} "
            f"AUROC {ts['auroc']:.3f}")


def seed_replicates(stage: "TraceRuns", variants: dict[str, tuple[str, dict[str, Any], str]],
                    seed_variants: Sequence[str], seeds: Sequence[int]
                    ) -> list[tuple[str, tuple[Path, str, TrainConfig]]]:
    """(variant name, job) of every further seed of each of `seed_variants` (names of `variants`,
    as ablation_variants gives them): the variant's overrides with another seed, in its own folder."""
    unknown = [v for v in seed_variants if v not in variants]
    if unknown:
        raise ValueError(f"seed_variants {unknown} are not among the runs {sorted(variants)}")
    out = []
    for v in seed_variants:
        backbone, over, tag = variants[v]
        out += [(v, stage.job(backbone, {**over, "seed": s}, "_".join(x for x in (tag, f"seed{s}") if x)))
                for s in seeds]
    return out


def seed_table(runs: dict[str, dict[str, Any]], seed_variants: Sequence[str], first_seed: int,
               replicates: Sequence[tuple[str, tuple[Path, str, TrainConfig]]], seed_runs: Sequence[dict[str, Any]],
               types: dict[str, str]) -> pd.DataFrame:
    """One row per (variant, seed): the seed-`first_seed` runs of `runs` and the replicates
    (seed_replicates, with their results `seed_runs`)."""
    def row(variant, seed_, r):
        ts = r["eval"]["splits"]["test_seen"]
        preds = [p for p in r["eval"]["predictions"] if p["split"] == "test_seen"]
        return {"variant": variant, "seed": seed_, "accuracy": ts["accuracy"], "auroc": ts["auroc"],
                "macro_f1": ts["macro_f1"], "acc_type_001": per_type_accuracy(preds, types).get("001", float("nan")),
                "unseen_accuracy": r["eval"]["splits"].get("test_unseen", {}).get("accuracy", float("nan")),
                "epochs_run": r["fit"]["epochs_run"], "best_epoch": r["fit"]["best_epoch"],
                "best_val_auroc": r["fit"]["best_val"]}
    tab = pd.DataFrame([row(v, first_seed, runs[v]) for v in seed_variants if v in runs] +
                       [row(v, c.seed, r) for (v, (_, _, c)), r in zip(replicates, seed_runs)])
    return tab.sort_values("variant", key=lambda v: v.map(list(seed_variants).index), kind="stable", ignore_index=True)


def multioff_runs(stage: "TraceRuns") -> tuple[dict[str, float], pd.DataFrame, pd.DataFrame, dict[str, Any], str]:
    """The MultiOFF recipe and the recipe without the contrastive loss: (metrics, one table row per
    run, the settings that differ from the official MultiOFF script, the runs, a summary line)."""
    backbone, recipe = stage.backbone(), stage.config()
    diff = pd.DataFrame(config_diff(recipe, "multioff"))
    if backbone != "clip-roberta-b32":
        diff = pd.concat([pd.DataFrame([{"setting": "backbone", "official": "clip-roberta-b32", "this run": backbone,
                                         "why": "profile"}]), diff], ignore_index=True)
    variants = {"recipe": ({}, ""), "recipe_without_contrastive": ({"fixed_weights": {**recipe.fixed_weights, "con": 0.0}},
                                                                   "no_con")}
    jobs = {name: stage.job(backbone, over, tag) for name, (over, tag) in variants.items()}
    stage.train(list(jobs.values()))
    train, val, test = split_rows(stage.data)
    y = stage.data.labels[test["test"]]
    out: dict[str, float] = {}
    table, runs = [], {}
    for name, job in jobs.items():
        r = runs[name] = stage.collect(job)
        m = r["eval"]["splits"]["test"]
        prefix = "multioff_" if name == "recipe" else "multioff_no_con_"
        out.update({f"{prefix}macro_f1": m["macro_f1"], f"{prefix}accuracy": m["accuracy"], f"{prefix}auroc": m["auroc"],
                    f"{prefix}accuracy_optimistic_threshold_on_test": m["accuracy_optimistic_threshold_on_test"]})
        table.append({"variant": name, "epochs": r["fit"]["epochs_run"], "best epoch": r["fit"]["best_epoch"],
                      "best val macro-F1": round(r["fit"]["best_val"], 3), **{k: round(v, 3) for k, v in m.items()},
                      "seconds": round(r["seconds"], 1)})
    out["multioff_majority_accuracy"] = float(max(y.mean(), 1 - y.mean()))
    line = (f"MultiOFF with {backbone}: {len(stage.data.ids)} memes (train {len(train)}, val {len(val)}, test {len(y)}); "
            f"always answering the majority class: accuracy {out['multioff_majority_accuracy']:.3f}")
    return out, pd.DataFrame(table), diff, runs, line


#: notebook 02's runs whose test_seen numbers metrics.json carries, with their key prefix
METRIC_RUNS = (("text_only", "text_only_"), ("caption_only", "caption_only_"), ("image_only", "image_only_"),
               ("image_text_only", "image_text_only_"),
               ("cls+con", "cls_con_"), ("all", "all_"), ("cls+con (cos/0.07)", "cls_con_cos007_"),
               ("cls+rel (image+caption scorer)", "image_caption_scorer_"))


def stage_metrics(runs: dict[str, dict[str, Any]], default: str, times: dict[str, float], seed_tab: pd.DataFrame,
                  with_types: bool, multioff: dict[str, float] | None = None) -> dict[str, Any]:
    """Notebook 02's metrics.json: the default run's test numbers, threshold, epochs and epoch
    times; accuracy / AUROC / per-type accuracy / caption use of the ablations; MultiOFF; the
    mean and sd over seeds of each seed variant."""
    d = runs[default]["eval"]
    ts = d["splits"]["test_seen"]
    m: dict[str, Any] = {"auroc": ts["auroc"], "accuracy": ts["accuracy"], "macro_f1": ts["macro_f1"],
                         "accuracy_optimistic_threshold_on_test": ts["accuracy_optimistic_threshold_on_test"],
                         "threshold": d["threshold"], "epochs_run": runs[default]["fit"]["epochs_run"],
                         "best_epoch": runs[default]["fit"]["best_epoch"],
                         "epoch_s_cached": times["cached"], "epoch_s_uncached": times["uncached"]}
    if "cached_prefix_only" in times:
        m["epoch_s_cached_prefix_only"] = times["cached_prefix_only"]
    if "test_unseen" in d["splits"]:
        m.update({"unseen_auroc": d["splits"]["test_unseen"]["auroc"],
                  "unseen_accuracy": d["splits"]["test_unseen"]["accuracy"]})
    for name, prefix in ((default, ""),) + METRIC_RUNS:
        if name not in runs:
            continue
        r = runs[name]
        if prefix:
            m[f"{prefix}accuracy"] = r["eval"]["splits"]["test_seen"]["accuracy"]
            m[f"{prefix}auroc"] = r["eval"]["splits"]["test_seen"]["auroc"]
        if with_types:
            for t in ("001", "110"):
                m[f"{prefix}acc_type_{t}"] = r["eval"]["per_type"].get(t, (float("nan"), 0))[0]
        m[f"{prefix or 'cls_rel_'}text_train_pick_share"] = r["curve"][-1]["train_pick_share"].get("text", float("nan"))
        m[f"{prefix or 'cls_rel_'}text_mean_weight"] = r["eval"]["mean_weight"]["test_seen"].get("text", float("nan"))
    m.update(multioff or {})
    for v, g in seed_tab.groupby("variant", sort=False):
        for col in ("accuracy", "auroc", "acc_type_001"):
            m[f"trace_seeds_{v.replace('+', '_')}_{col}_mean"] = float(g[col].mean())
            m[f"trace_seeds_{v.replace('+', '_')}_{col}_sd"] = float(g[col].std())
    m["n_seeds"] = int(seed_tab.groupby("variant").size().min()) if len(seed_tab) else 1
    m.update(caption_benefit(runs, default, seed_tab))
    return m


def caption_benefit(runs: dict[str, dict[str, Any]], default: str, seed_tab: pd.DataFrame,
                    without: str = "image_text_only", split: str = "test_seen") -> dict[str, float]:
    """TRACE's claim, that captions help, as one test: the default model against the same model
    without captions (image and meme text only). Per seed: the accuracy difference (mean, sd, the
    number of seeds where captions help, seeds paired by number); on the first seed's predictions:
    the paired test every claims table uses (`metrics.paired_accuracy_test`: exact McNemar over the
    same memes, a paired bootstrap interval of the difference with memes resampled).
    Empty when the no-caption run is missing."""
    if without not in runs or default not in runs:
        return {}
    pa = {p["id"]: p for p in runs[default]["eval"]["predictions"] if p["split"] == split}
    pb = {p["id"]: p for p in runs[without]["eval"]["predictions"] if p["split"] == split}
    ids = sorted(set(pa) & set(pb))
    t = paired_accuracy_test({i: pa[i]["prediction"] == pa[i]["label"] for i in ids},
                             {i: pb[i]["prediction"] == pb[i]["label"] for i in ids}, {i: pa[i]["label"] for i in ids})
    out = {"caption_benefit_acc": t["difference"], "caption_benefit_ci_low": t["ci_difference"][0],
           "caption_benefit_ci_high": t["ci_difference"][1], "caption_benefit_mcnemar_p": t["p"],
           "caption_benefit_n": t["n"], "caption_benefit_only_default_right": t["only_a_right"],
           "caption_benefit_only_without_right": t["only_b_right"]}
    a = seed_tab[seed_tab.variant == default].set_index("seed")["accuracy"]
    b = seed_tab[seed_tab.variant == without].set_index("seed")["accuracy"]
    both = a.index.intersection(b.index)
    if len(both):
        d = a[both] - b[both]
        out.update({"caption_benefit_seeds_mean": float(d.mean()), "caption_benefit_seeds_sd": float(d.std()),
                    "caption_benefit_seeds_positive": int((d > 0).sum()), "caption_benefit_n_seeds": int(len(d))})
    return out
