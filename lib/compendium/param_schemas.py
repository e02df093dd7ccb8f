"""Nested schemas for the parameter profiles: one declaration per stage that both validates and
documents what may appear *inside* a stage's keys (lib.compendium.params checks the keys themselves).

Each rule returns a list of problems; `lib.compendium.params.validate_profile` prefixes them with the file
and the dotted key, so `make check-params` names file, section and key for every problem:
unknown keys inside nested sections, names that must come from a registry (encoder and chat
presets, datasets and their loader options, benchmarks, loss configs, schemas, debate stages),
choices, ranges, and the type of every key whose notebook default is None.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Callable

from lib import ROOT
from lib.compendium.artifacts import project_path
from lib.data.datasets import REGISTRY, loader_options
from lib.data.injection import CONTROL_PHRASINGS, MITIGATIONS, PHRASINGS
from lib.compendium.presets import presets


class Rule:
    def check(self, v: Any, path: str) -> list[str]:
        raise NotImplementedError


class AnyValue(Rule):
    def check(self, v, path):
        return []


class Type(Rule):
    def __init__(self, *types: type):
        self.types = types

    def check(self, v, path):
        if isinstance(v, bool) and bool not in self.types:
            return [f"{path}: {v!r} is a boolean, expected {'/'.join(t.__name__ for t in self.types)}"]
        if not isinstance(v, self.types):
            return [f"{path}: {v!r} is {type(v).__name__}, expected {'/'.join(t.__name__ for t in self.types)}"]
        return []


class Opt(Rule):
    """None, or what `rule` accepts."""
    def __init__(self, rule: Rule):
        self.rule = rule

    def check(self, v, path):
        return [] if v is None else self.rule.check(v, path)


class Choice(Rule):
    def __init__(self, *values: Any):
        self.values = values

    def check(self, v, path):
        return [] if v in self.values else [f"{path}: {v!r} is not one of {', '.join(map(repr, self.values))}"]


class Range(Rule):
    def __init__(self, lo: float | None = None, hi: float | None = None, integer: bool = False):
        self.lo, self.hi, self.integer = lo, hi, integer

    def check(self, v, path):
        t = Type(int) if self.integer else Type(int, float)
        errs = t.check(v, path)
        if errs:
            return errs
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            return [f"{path}: {v!r} is outside [{self.lo if self.lo is not None else '-inf'}, "
                    f"{self.hi if self.hi is not None else 'inf'}]"]
        return []


class ListOf(Rule):
    def __init__(self, item: Rule, min_len: int = 0):
        self.item, self.min_len = item, min_len

    def check(self, v, path):
        if not isinstance(v, (list, tuple)):
            return [f"{path}: {v!r} is {type(v).__name__}, expected a list"]
        errs = [f"{path}: needs at least {self.min_len} item(s)"] if len(v) < self.min_len else []
        for i, x in enumerate(v):
            errs += self.item.check(x, f"{path}[{i}]")
        return errs


class MapOf(Rule):
    def __init__(self, key: Rule, value: Rule):
        self.key, self.value = key, value

    def check(self, v, path):
        if not isinstance(v, dict):
            return [f"{path}: {v!r} is {type(v).__name__}, expected a mapping"]
        errs = []
        for k, x in v.items():
            errs += [e.replace(f"{path}.{k}:", f"{path}: key {k!r}:", 1) for e in self.key.check(k, f"{path}.{k}")]
            errs += self.value.check(x, f"{path}.{k}")
        return errs


class Struct(Rule):
    """A mapping with known keys (each with its rule); unknown keys are errors unless open."""
    def __init__(self, fields: dict[str, Rule], required: tuple[str, ...] = (), open: bool = False):
        self.fields, self.required, self.open = fields, required, open

    def check(self, v, path):
        if not isinstance(v, dict):
            return [f"{path}: {v!r} is {type(v).__name__}, expected a mapping"]
        errs = [f"{path}: missing key '{k}'" for k in self.required if k not in v]
        for k, x in v.items():
            if k not in self.fields:
                if not self.open:
                    errs.append(f"{path}.{k}: unknown key (known: {', '.join(sorted(self.fields))})")
                continue
            errs += self.fields[k].check(x, f"{path}.{k}")
        return errs


class OneOf(Rule):
    """Struct variants chosen by a discriminating key (e.g. a grounder's `kind`)."""
    def __init__(self, key: str, variants: dict[str, Rule]):
        self.key, self.variants = key, variants

    def check(self, v, path):
        if not isinstance(v, dict):
            return [f"{path}: {v!r} is {type(v).__name__}, expected a mapping"]
        kind = v.get(self.key)
        if kind not in self.variants:
            return [f"{path}.{self.key}: {kind!r} is not one of {', '.join(map(repr, self.variants))}"]
        return self.variants[kind].check(v, path)


class Lazy(Rule):
    """A rule built on first use (registries that import heavy modules)."""
    def __init__(self, make: Callable[[], Rule]):
        self.make, self._rule = make, None

    def check(self, v, path):
        if self._rule is None:
            self._rule = self.make()
        return self._rule.check(v, path)


class Preset(Rule):
    """A preset name of `kind` (params/presets/<kind>.yaml), or a local model folder if allowed."""
    def __init__(self, kind: str, allow_path: bool = True, allow_empty: bool = False):
        self.kind, self.allow_path, self.allow_empty = kind, allow_path, allow_empty

    def check(self, v, path):
        if not isinstance(v, str):
            return [f"{path}: {v!r} is {type(v).__name__}, expected a {self.kind} preset name"]
        if self.allow_empty and v == "":
            return []
        names = presets(self.kind)
        if v in names:
            return []
        if self.allow_path and ("/" in v or v.startswith(".")) and (Path(v).is_dir() or (ROOT / v).is_dir()):
            return []
        label = {"encoders": "an encoder", "chat": "a chat"}.get(self.kind, f"a {self.kind}")
        return [f"{path}: {v!r} is not {label} preset (params/presets/{self.kind}.yaml: "
                f"{', '.join(sorted(names))}){' or an existing model folder' if self.allow_path else ''}"]


class DatasetName(Rule):
    def __init__(self, family: str | None = None):
        self.family = family

    def check(self, v, path):
        ok = [n for n, d in REGISTRY.items() if self.family is None or d.family == self.family]
        fam = f"{'an' if self.family and self.family[0] in 'aeiou' else 'a'} {self.family}" if self.family else "a"
        return [] if v in ok else [f"{path}: {v!r} is not {fam} dataset "
                                   f"({', '.join(sorted(ok))})"]


class DatasetSources(Rule):
    """00_data_prep.datasets: name -> {root, <that loader's options>}."""
    def check(self, v, path):
        if not isinstance(v, dict):
            return [f"{path}: expected a mapping of dataset name -> {{root, options}}"]
        errs = []
        for name, src in v.items():
            if name not in REGISTRY:
                errs.append(f"{path}.{name}: unknown dataset (registered: {', '.join(sorted(REGISTRY))})")
                continue
            fields = {"root": Type(str), "allow_outside_images": Type(bool),
                      **{o: AnyValue() for o in loader_options(name)}}
            errs += Struct(fields, required=("root",)).check(src, f"{path}.{name}")
        return errs


class SchemaName(Rule):
    def check(self, v, path):
        known = sorted(p.stem for p in (ROOT / "params" / "schemas").glob("*.json"))
        return [] if v in known else [f"{path}: {v!r} is not a schema in params/schemas ({', '.join(known)})"]


class Folder(Rule):
    """A folder inside the repository (relative) or anywhere (absolute) that must exist."""
    kind = "folder"

    def exists(self, p: Path) -> bool:
        return p.is_dir()

    def check(self, v, path):
        if not isinstance(v, str):
            return [f"{path}: {v!r} is {type(v).__name__}, expected a {self.kind} path"]
        return [] if self.exists(project_path(v)) else [f"{path}: {self.kind} {v!r} does not exist"]


class File(Folder):
    """A file inside the repository (relative) or anywhere (absolute) that must exist."""
    kind = "file"

    def exists(self, p: Path) -> bool:
        return p.is_file()


def rule_for(annotation: Any, where: str = "") -> Rule:
    """The Rule a type annotation states: int, float (an int is accepted), bool, str, `X | None`, `Literal[...]`,
    list/tuple of a type (a fixed-length tuple checks its length), dict of key and value types, and `Any`.
    An annotation this cannot read is an error naming the field, never a silent AnyValue."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is typing.Any:
        return AnyValue()
    if annotation in (int, str, bool):
        return Type(annotation)
    if annotation is float:
        return Type(int, float)
    if origin is typing.Literal:
        return Choice(*args)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        rule = rule_for(inner[0], where) if len(inner) == 1 else AnyOf(*(rule_for(a, where) for a in inner))
        return Opt(rule) if type(None) in args else rule
    if origin in (list, tuple) or annotation in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return TupleOf(*(rule_for(a, where) for a in args))
        return ListOf(rule_for(args[0], where) if args else AnyValue())
    if origin is dict or annotation is dict:
        return MapOf(rule_for(args[0], where), rule_for(args[1], where)) if args else Type(dict)
    raise TypeError(f"{where}: the annotation {annotation!r} has no parameter rule (lib/compendium/param_schemas.py rule_for)")


class AnyOf(Rule):
    """What one of `rules` accepts (an annotation `int | str`)."""
    def __init__(self, *rules: Rule):
        self.rules = rules

    def check(self, v, path):
        found = [r.check(v, path) for r in self.rules]
        return [] if any(not f for f in found) else found[0]


class TupleOf(Rule):
    """A list of exactly one value per rule (an annotation `tuple[float, float, float]`)."""
    def __init__(self, *rules: Rule):
        self.rules = rules

    def check(self, v, path):
        if not isinstance(v, (list, tuple)):
            return [f"{path}: {v!r} is {type(v).__name__}, expected a list of {len(self.rules)}"]
        if len(v) != len(self.rules):
            return [f"{path}: {v!r} has {len(v)} item(s), expected {len(self.rules)}"]
        return [e for i, (r, x) in enumerate(zip(self.rules, v)) for e in r.check(x, f"{path}[{i}]")]


def _dataclass_fields(cls, **extra: Rule) -> Struct:
    """A Struct over a dataclass's fields, each checked by the rule its type annotation states (`rule_for`);
    `extra` narrows a field further (a choice of values, a range). A field whose default is None is checked
    by its annotation like any other (`X | None`), never accepted whatever its type."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Rule] = {f.name: rule_for(hints[f.name], f"{cls.__name__}.{f.name}")
                               for f in dataclasses.fields(cls)}
    for name, rule in extra.items():
        base = fields.get(name)
        fields[name] = rule if base is None else AllOf(base, rule)
    return Struct(fields)


class AllOf(Rule):
    """What every rule accepts (a field's annotation, then a narrower rule): the first that refuses speaks."""
    def __init__(self, *rules: Rule):
        self.rules = rules

    def check(self, v, path):
        for r in self.rules:
            errs = r.check(v, path)
            if errs:
                return errs
        return []


def _trace_recipe(with_backbone: bool = False) -> Rule:
    from lib.trace.model import (LOSS_CONFIGS, MODALITIES,  # lazy: the method loads torch; check-params needs it only here
                           TrainConfig)
    extra = {"loss_config": Choice(*LOSS_CONFIGS), "modality": Choice(*MODALITIES),
             "select_on": Choice("auroc", "macro_f1"), "scorer_input": Choice("caption", "image+caption"),
             "scorer_arch": Choice("full", "small"), "gumbel_over": Choice("logits", "probs"),
             "contrastive_features": Choice("clip", "head"), "contrastive_caption": Choice("selected", "argmax"),
             "head_inputs": Choice("auto", "pooled", "projected"), "xavier": Choice("scorer", "all"),
             "val_threshold_by": Choice("accuracy", "macro_f1"), "selection_temperature": Opt(Range(0, 100)),
             "head_final_dropout": Opt(Type(bool)), "fixed_weights": Opt(MapOf(Choice("cls", "rel", "con"), Range(0, 100))),
             "cache_dtype": Choice("float32", "float16", "bfloat16")}
    if with_backbone:
        extra["backbone"] = Preset("encoders")
    return _dataclass_fields(TrainConfig, **extra)


def _court_variant() -> Rule:
    from lib.arcade.court import STAGES, CourtConfig  # lazy: first use only, as every method rule (Lazy)
    return _dataclass_fields(CourtConfig, samples=Range(0, integer=True), types=ListOf(Type(str), 1), oracle=Type(bool),
                             string_max_length=Opt(Range(1, integer=True)),
                             prompt_layout=Choice("role_first", "definition_first"),
                             class_mode=Choice("multiclass", "binary"), run_mode=Choice("arcade", "none"),
                             debate_visibility=Choice("transcript", "official"), parse=Choice("structured", "official"),
                             debater_failure=Choice("stop", "pass_on"),
                             temperatures=MapOf(Choice(*STAGES), Range(0, 2)),
                             max_new_tokens=MapOf(Choice(*STAGES), Range(1, integer=True)))


def _debate_stage() -> Rule:
    from lib.arcade.court import STAGES  # lazy: first use only, as every method rule (Lazy)
    return Choice(*STAGES)


def _agent_recipe() -> Rule:
    from lib.sei.agents import AgentRecipe  # lazy: the agent trainer loads torch; check-params needs it only here
    return _dataclass_fields(AgentRecipe, mixed_precision=Choice("no", "bf16", "fp16"),
                             dtype=Choice("float32", "bfloat16", "float16"), lr=Range(0, 1), epochs=Range(1, integer=True),
                             batch_size=Range(1, integer=True), warmup_share=Range(0, 1))


def _interplay_recipe() -> Rule:
    from lib.trace.interplay import InterplayConfig  # lazy: the captioner's module loads the VLM code
    return _dataclass_fields(InterplayConfig, lr=Range(0, 1), epochs=Range(1, integer=True),
                             batch_size=Range(1, integer=True), max_train=Range(0, integer=True))


def _agent_name() -> Rule:
    from lib.sei.agents import AGENTS  # lazy: the agent trainer loads torch
    return Choice(*AGENTS)


ENC = Preset("encoders")


class Retriever(Preset):
    """An encoder preset or folder, optionally with "+text" (lib.sei.retrieval.TEXT_SUFFIX: the meme's text
    embedded beside its picture)."""
    def __init__(self):
        super().__init__("encoders")

    def check(self, v, path):
        return super().check(v[: -len("+text")] if isinstance(v, str) and v.endswith("+text") else v, path)


CHAT = Preset("chat")
PROB = Range(0, 1)
POS = Range(1, integer=True)
NONNEG = Range(0, integer=True)

#: stage -> key -> rule, for the keys whose content lib.compendium.params' type check cannot see.
def _phrasing():
    return Choice(*[p for p in PHRASINGS if p not in CONTROL_PHRASINGS])


def _control():
    return Choice(*CONTROL_PHRASINGS)


def _mitigation():
    return Choice(*MITIGATIONS)


SCHEMAS: dict[str, dict[str, Rule]] = {
    "00_data_prep": {
        "memeworld_n": Range(50, integer=True), "memeworld_n_multioff": NONNEG, "image_size": Range(32, 2048, True),
        "label_noise": Range(0, 0.5), "confounder_rate": PROB, "datasets": DatasetSources(),
        "check_images": Choice("none", "exists", "decode"), "gallery_per_type": NONNEG,
    },
    "models": {"clip_epochs": POS, "vlm_epochs": POS, "vlm_eval_n": POS, "ablation_epochs": NONNEG, "nli_epochs": NONNEG},
    "01_captioning": {
        "datasets_to_caption": MapOf(DatasetName("meme"), Type(str)),
        "tagger_encoder": ENC, "tag_vocabulary_file": Opt(Type(str)), "tag_top_k": POS, "tag_min_prob": PROB,
        "grounder": Opt(OneOf("kind", {
            "crops": Struct({"kind": AnyValue(), "encoder": ENC, "scales": ListOf(Range(0.05, 1), 1),
                             "stride": Range(0.01, 1)}, required=("encoder",)),
            "grounding-dino": Struct({"kind": AnyValue(), "model": Type(str), "revision": Opt(Type(str)),
                                      "box_threshold": PROB, "text_threshold": PROB})})),
        "captioners": MapOf(Type(str), Struct({"preset": CHAT, "grounded": Type(bool)}, required=("preset",))),
        "max_new_tokens": POS, "max_memes": NONNEG, "device": Opt(Type(str)),
        "interplay_captioner": Opt(Struct({"column": Type(str), "preset": CHAT, "base": CHAT, "dataset": DatasetName("meme"),
                                           "check_split": Type(str), "recipe": Lazy(_interplay_recipe)},
                                          required=("column", "preset", "base"))),
    },
    "02_finetuning": {
        "backbones": ListOf(ENC, 1), "recipes": MapOf(ENC, Lazy(_trace_recipe)),
        "caption_columns": ListOf(Type(str)), "unfreeze_text_layers": ListOf(Type(int), 1),
        "loss_configs": ListOf(Lazy(lambda: Choice(*__import__("lib.trace.model", fromlist=["LOSS_CONFIGS"]).LOSS_CONFIGS))),
        "baselines": ListOf(Choice("text", "caption", "image", "image_text")), "multioff": Opt(Lazy(lambda: _trace_recipe(with_backbone=True))),
        "method": Lazy(_trace_recipe), "max_memes": NONNEG, "extra_variants": MapOf(Type(str), Lazy(_trace_recipe)),
        "lr": Range(0, 1), "epochs": POS, "batch_size": POS, "grad_accum": POS, "patience": POS,
        "lora_rank": NONNEG, "hidden": POS, "device": Opt(Type(str)), "train_workers": POS,
        "seeds": ListOf(NONNEG), "seed_variants": ListOf(Type(str)),   # run names; checked against the runs by seed_replicates
        "caption_options": MapOf(Type(str), ListOf(Type(str), 1)),    # option name -> the default model's candidate columns
    },
    "03_clip4dm": {
        "encoders": ListOf(ENC, 1), "benchmarks": ListOf(DatasetName("alignment"), 1), "nli_model": Opt(Type(str)),
        "hard_negative_ablation": Opt(MapOf(Choice("leak_free", "no_hard_negatives"), ENC)),
        "epsilon_from_validation": Opt(Type(str)), "epsilon_grid": ListOf(Range(None, 0), 1),
        "max_pairs": NONNEG, "batch_size": POS, "speed_pairs": NONNEG, "n_examples": NONNEG, "claim_resamples": POS, "device": Opt(Type(str)),
    },
    "serving": {
        "served_preset": CHAT, "hf_preset": Preset("chat", allow_empty=True), "concurrency": ListOf(POS, 1),
        "hf_concurrency": ListOf(POS), "n_requests": POS, "hf_requests": POS, "schemas": ListOf(SchemaName()),
        "max_new_tokens": POS, "shots": NONNEG,
    },
    "04_few_shot": {
        "datasets": MapOf(DatasetName("meme"), Struct({"test_split": Type(str), "definitions": Type(str)},
                                                      required=("test_split", "definitions"))),
        "eval_n": NONNEG, "eval_balance": Choice("label", "type"),
        "subset": Opt(Struct({"n": POS, "settings": ListOf(Type(str), 1)}, required=("n", "settings"))),
        "cold_runs": Struct({"runs": POS, "settings": ListOf(Type(str)), "n": Opt(POS)}, required=("runs", "settings")),
        "answer_format": Choice("free_text", "structured"), "string_max_length": Opt(POS),
        "agent_base": CHAT, "agent_recipe": Lazy(_agent_recipe),
        "agent_overrides": Lazy(lambda: MapOf(_agent_name(), _agent_recipe())),
        "agent_prompt_dir": Folder(), "agent_eval_n": NONNEG, "agent_max_new_tokens": POS,
        "intervention_input": Choice("generated", "gold"), "retrievers": ListOf(Retriever(), 1), "shots": ListOf(POS, 1),
        "order": Choice("most_similar_last", "most_similar_first"),
        "controls": MapOf(Type(str), Struct({"n": NONNEG, "retriever": Type(str),
                                             "exemplars": Choice("retrieved", "random", "shuffled_labels", "same_type"),
                                             "structured": Type(bool), "labels_only": Type(bool)})),
        "knn_n": POS, "exemplar_texts": Choice("silver", "gold"), "models": ListOf(CHAT, 1),
        "serve_preset": Opt(CHAT), "prompt_dir": Folder(), "temperature": Range(0, 2), "max_new_tokens": POS,
        "adapted": Opt(Struct({"model": CHAT, "control": CHAT, "n_train": POS, "settings": ListOf(Type(str), 1),
                               "control_settings": ListOf(Type(str)),
                               "recipe": Struct({"epochs": POS, "lr": Range(0, 1), "rank": POS, "alpha": Range(0, 1024),
                                                 "batch_size": POS, "max_len": POS})},
                              required=("model", "control", "n_train", "settings", "recipe"))),
        "parser": Choice("strict", "lenient"), "explanation_refs": DatasetName("explanation"),
        "intervention_refs": DatasetName("explanation"),
        "bertscore": Struct({"model": Type(str), "layers": POS, "proxy": Type(bool)}, required=("model", "layers")),
        "ci_resamples": Range(100, integer=True), "ci_method": Choice("BCa", "percentile"),
        "perplexity": Choice("self", "reference"), "wordshift_top": POS,
    },
    "05_debate": {
        "dataset": DatasetName("meme"), "samples": NONNEG, "chat_preset": CHAT, "serve_preset": Opt(CHAT),
        "class_mode": Choice("multiclass", "binary"), "rounds": POS,
        "variants": MapOf(Type(str), Lazy(_court_variant)),
        "cold_runs": Struct({"runs": POS, "variants": ListOf(Type(str))}, required=("runs", "variants")),
        "temperatures": Lazy(lambda: MapOf(_debate_stage(), Range(0, 2))),
        "max_new_tokens": Lazy(lambda: MapOf(_debate_stage(), POS)),
        "prompt_dir": Folder(), "official_prompts_repo": Opt(Type(str)), "workers": POS,
        "world_knowledge": Opt(File()),
        "adapted_judge": Opt(Struct({"model": CHAT, "control": CHAT, "n_train": POS, "examples_from": Type(str),
                                     "variants": ListOf(Type(str), 1), "control_variants": ListOf(Type(str)),
                                     "recipe": Struct({"epochs": POS, "lr": Range(0, 1), "rank": POS,
                                                       "alpha": Range(0, 1024), "batch_size": POS, "max_len": POS})},
                                    required=("model", "control", "n_train", "examples_from", "variants", "recipe"))),
    },
    "06_evaluation": {
        "trace_dataset": Choice("fhm", "multioff"), "n_resamples": Range(100, integer=True),
        "ci_method": Choice("percentile", "BCa", "basic", "wilson", "exact"), "confidence": Range(0.5, 0.999),
        "alpha": Range(0.0001, 0.5), "correction": Choice("holm", "bonferroni", "fdr_bh", "holm-sidak", "sidak"),
        "injection": Struct({"n_llm": NONNEG, "n_trace": NONNEG, "phrasings": ListOf(Lazy(_phrasing), 1),
                             "control": Opt(Lazy(_control)), "llm_per_meme": Choice("one", "all"),
                             "trace_per_meme": Choice("one", "all"), "where": Choice("both", "image", "text"),
                             "trace_where": ListOf(Choice("both", "image", "text")),
                             "seed": NONNEG}, required=("n_llm", "n_trace", "phrasings", "control", "llm_per_meme",
                                                        "trace_per_meme", "where", "trace_where", "seed")),
        "mitigation": Lazy(_mitigation), "gallery_n": NONNEG,
    },
}


def check_section(stage: str, section: dict[str, Any]) -> list[str]:
    """Problems inside one stage's section, each as "stage.key...: message"."""
    rules = SCHEMAS.get(stage, {})
    errs: list[str] = []
    for key, rule in rules.items():
        if key in section:
            errs += rule.check(section[key], f"{stage}.{key}")
    return errs
