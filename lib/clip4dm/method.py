"""CLIP4DM: dense misalignment from CLIP by negative gradient attribution.

    from lib.clip4dm.method import CLIP4DM
    model = CLIP4DM.from_pretrained("clip-vit-b32", template="A photo depicts ",
                                    start_layer_text=-3, sorted_by="threshold", epsilon=-5e-5)
    model(image, "a cup of coke")
    # {'negative_word': '3_coke', 'sum_negative_attribution': ..., 'negative_word_score_list': [...],
    #  'clip_score': ..., 'word_attributions': [('a', ...), ('cup', ...), ('of', ...), ('coke', ...)]}

For one (image, caption): the text is template + caption; s = cosine(image embedding, text
embedding); for each of the last |start_layer_text| text layers, cam = mean over heads of
(ds/dA * A) with A the post-softmax attention (negative values kept); R = mean over those
layers; token scores are R's row at the pooled (EOT) position over the content tokens; a
word's score is the mean of its tokens'; template words are dropped.

`batch` runs many pairs per forward and backward pass. Each pair's similarity depends only
on its own sequence and the causal/padding masks keep padded positions out of the EOT row,
so one backward pass of the summed similarities gives every pair's attribution, equal to
the one-pair path.

PATH may be a preset name (params/presets/encoders.yaml) or any local Hugging Face CLIP
folder. Hugging Face SigLIP works too (its pooled position is the last token); open_clip
raises a clear error because its text attention maps are not reachable.
"""
from __future__ import annotations

import argparse
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from lib.data.records import CAPTION_WORD_RE, caption_words, normalize_word as _norm
from lib.models.encoders import AttentionUnavailable, Encoder, load_encoder
from lib.evaluation.metrics import average_precision
from lib.models.nli import nli_entailment  # noqa: F401  (SeeTRUE's scorer; public here too)

PUNCT = {".", ","}
WORD_RE = CAPTION_WORD_RE          # the same split the benchmark loaders locate words with
#: function words: a FOIL foil word is always a content word (a noun swapped for another), so the
#: chance of a localiser that knows only that is 1 / the caption's content words, not 1 / its words
CLOSED_CLASS_WORDS = frozenset("""a an the this that these those some any each every no another other its their his her
our your my of in on at to for from with without by about above below under over into onto near beside behind
between among through across along around up down out off next and or but nor so yet while as than then there
here is are was were be been being am has have had do does did can could will would shall should may might must
it they them he she we you i who whom whose which what where when one two three four five several many few more
most very too also not just only all both either neither""".split())


def content_words(words: Sequence[str]) -> list[str]:
    """The words of a caption that are neither punctuation nor closed-class (CLOSED_CLASS_WORDS)."""
    return [w for w in words if w not in PUNCT and w.lower().strip(".,") not in CLOSED_CLASS_WORDS]


def words_with_spans(text: str) -> list[tuple[str, int, int]]:
    """Split on spaces with '.' and ',' as their own words; (word, start, end) character spans."""
    return [(m.group(), m.start(), m.end()) for m in WORD_RE.finditer(text)]


def length_batches(captions: Sequence[str], batch_size: int) -> list[list[int]]:
    """Indices of `captions` in batches of `batch_size`, similar lengths together (less padding):
    the batches `CLIP4DM.batch` runs, and the ones its floor is timed on."""
    order = sorted(range(len(captions)), key=lambda i: len(captions[i]))
    return [order[k:k + batch_size] for k in range(0, len(order), batch_size)]


class CLIP4DM:
    def __init__(self, encoder: Encoder, template: str = "A photo depicts ", start_layer_text: int = -3,
                 sorted_by: str = "threshold", epsilon: float = -5e-5, batch_size: int = 32):
        if sorted_by not in ("threshold", "most_negative"):
            raise ValueError(f"sorted_by must be 'threshold' or 'most_negative', not {sorted_by!r}")
        if start_layer_text >= 0:
            raise ValueError(f"start_layer_text counts from the last layer and must be negative, not {start_layer_text}")
        if not encoder.supports_attention:
            raise AttentionUnavailable(f"CLIP4DM needs differentiable text attention maps; the {encoder.backend} "
                                       f"backend does not expose them (use a Hugging Face CLIP or SigLIP model)")
        self.encoder = encoder
        self.template = template
        self.start_layer_text = start_layer_text
        self.sorted_by = sorted_by
        self.epsilon = epsilon
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(cls, name_or_path, device: str | None = None, **kw) -> "CLIP4DM":
        return cls(load_encoder(name_or_path, device=device), **kw)

    # ------------------------------------------------------------------ public API
    def __call__(self, image, caption: str) -> dict[str, Any]:
        return self._attribute([image], [caption])[0]

    #: batches whose captions are tokenised in one call (the tokenizer's per-call cost is paid once)
    tokenize_window = 64

    def batch(self, images: Sequence, captions: Sequence[str], batch_size: int | None = None,
              progress: bool = False, desc: str = "CLIP4DM", prefetch: bool = False) -> list[dict[str, Any]]:
        """The same dicts as __call__, for many pairs, `batch_size` pairs per pass. `images` may be
        PIL images or ready pixel tensors [3, H, W] (then no preprocessing runs here). Captions of
        similar length share a pass; the captions of `tokenize_window` passes are tokenised in one
        call and each pass takes its rows, cut to its own longest caption (the same tokens as
        tokenising the pass alone). With `prefetch`, the next pass's inputs are prepared on a
        helper thread while the current one runs (same results). Off by default: on 2 CPU cores
        the helper thread competes with torch's own threads and the batched path got slower
        (1,631 -> 1,078 pairs/s from PIL images on memeworld-clip); on a GPU, where the model
        does not use the CPU cores, it can pay."""
        import torch
        if len(images) != len(captions):
            raise ValueError(f"batch: {len(images)} images but {len(captions)} captions")
        chunks = length_batches(captions, batch_size or self.batch_size)
        trim = bool(getattr(self.encoder, "trims_padding", False))
        window: dict[int, tuple] = {}

        def tokens_of(j):
            g = j // self.tokenize_window
            if g not in window:
                window.clear()
                idx = [i for c in chunks[g * self.tokenize_window:(g + 1) * self.tokenize_window] for i in c]
                toks, offs = self._tokenize([self.template + captions[i] for i in idx])
                window[g] = ({k: v for k, v in toks.items() if hasattr(v, "shape")}, offs,
                             {i: r for r, i in enumerate(idx)})
            toks, offs, row = window[g]
            rows = torch.as_tensor([row[i] for i in chunks[j]])
            tokens, offsets = {k: v[rows] for k, v in toks.items()}, offs[rows]
            if trim and "attention_mask" in tokens:
                n = int(tokens["attention_mask"].sum(1).max())
                tokens, offsets = {k: v[:, :n] for k, v in tokens.items()}, offsets[:, :n]
            return tokens, offsets

        def prep(j):
            idx = chunks[j]
            texts = [self.template + captions[i] for i in idx]
            tokens, offsets = tokens_of(j)
            ims = [images[i] for i in idx]
            pix = {"pixel_values": torch.stack(ims)} if isinstance(ims[0], torch.Tensor) else self.encoder.preprocess(ims)
            return idx, texts, tokens, offsets, pix

        out: list[dict[str, Any] | None] = [None] * len(captions)
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(prep, 0) if prefetch and chunks else None
            for j in tqdm(range(len(chunks)), desc=desc, disable=not progress):
                idx, texts, tokens, offsets, pix = fut.result() if fut is not None else prep(j)
                fut = pool.submit(prep, j + 1) if prefetch and j + 1 < len(chunks) else None
                img = self.image_embeddings(pix)
                scores, offs, sims, texts = self._scores(texts, tokens, offsets, img)
                for i, t, sc, of, c in zip(idx, texts, scores, offs, sims):
                    out[i] = self._words(t, sc, of, float(c))
        return out  # type: ignore[return-value]

    # ------------------------------------------------------------------ internals
    def _tokenize(self, texts: list[str]):
        return self.encoder.tokenize_with_offsets(texts)

    def image_embeddings(self, images) -> Any:
        """Normalised image embeddings (no gradient): compute once per image and pass them to
        `token_scores(..., image_embeds=...)` when several captions share an image."""
        import torch
        import torch.nn.functional as F
        with torch.no_grad():
            return F.normalize(self.encoder.encode_images(images, normalize=False).float(), dim=-1)

    def token_scores(self, images, captions, image_embeds=None
                     ) -> tuple[list[np.ndarray], list[list[tuple[int, int]]], np.ndarray, list[str]]:
        """Per pair: content-token scores, their character offsets, and the cosine similarities.

        image_embeds: the images' normalised embeddings, if already computed (then `images` is not
        read). Only the end-of-text row of each attributed layer's grad x attention is formed: the
        scores read nothing else."""
        texts = [self.template + c for c in captions]
        tokens, offsets = self._tokenize(texts)
        img = self.image_embeddings(images) if image_embeds is None else image_embeds
        return self._scores(texts, tokens, offsets, img)

    def _scores(self, texts, tokens, offsets, img):
        import torch
        import torch.nn.functional as F
        img = img.to(self.encoder.device).float()
        k = -self.start_layer_text
        with torch.enable_grad():
            emb, layers, pool = self.encoder.text_forward_attributed(tokens, k)
            txt = F.normalize(emb.float(), dim=-1)
            sims = (img * txt).sum(-1)
            grads = torch.autograd.grad(sims.sum(), layers)
        ar = torch.arange(len(texts), device=pool.device)

        def eot(t):                                   # the pooled row of a map, [B, H, T]
            return t[:, :, 0] if t.shape[2] == 1 else t[ar, :, pool]
        R = torch.stack([(eot(g) * eot(a)).float().mean(1) for g, a in zip(grads, layers)]).mean(0)
        R = R.detach().cpu().double().numpy()                             # [B, T]: the EOT row per pair
        offs = np.asarray(offsets.cpu() if hasattr(offsets, "cpu") else offsets, dtype=np.int64)   # [B, T, 2]
        # content tokens before the pooled one (special tokens and padding have empty spans)
        keep = (offs[..., 1] > offs[..., 0]) & (np.arange(offs.shape[1])[None, :] < pool.cpu().numpy()[:, None])
        out_scores, out_offsets = [], []
        for b in range(len(texts)):
            idx = np.flatnonzero(keep[b])
            out_scores.append(R[b, idx].tolist())
            out_offsets.append([tuple(o) for o in offs[b, idx].tolist()])
        return out_scores, out_offsets, sims.detach().cpu().numpy().astype(np.float64), texts

    def _attribute(self, images, captions) -> list[dict[str, Any]]:
        scores, offsets, sims, texts = self.token_scores(images, captions)
        return [self._words(t, s, o, float(c)) for t, s, o, c in zip(texts, scores, offsets, sims)]

    def _words(self, text: str, tok_scores: np.ndarray, tok_offsets: list[tuple[int, int]], cos: float) -> dict[str, Any]:
        spans = words_with_spans(text)
        buckets: list[list[float]] = [[] for _ in spans]
        w = 0
        for score, (start, _end) in zip(tok_scores, tok_offsets):
            while w < len(spans) and start >= spans[w][2]:
                w += 1
            if w < len(spans):
                buckets[w].append(score)
        n_template = len(self.template)
        n_tpl_words = sum(1 for _, s, _ in spans if s < n_template)
        attributions, positions = [], []
        for k, ((word, s, _), b) in enumerate(zip(spans, buckets)):
            if s >= n_template and b:
                attributions.append((word, sum(b) / len(b)))
                positions.append(k - n_tpl_words)          # index among the caption's words ("." and "," count)
        return self._select(attributions, cos, positions)

    def _select(self, attributions: list[tuple[str, float]], cos: float,
                positions: list[int] | None = None) -> dict[str, Any]:
        """The official output for these word attributions, plus richer keys.

        Official keys (exactly what the official `CLIP4DM.__call__` returns):
        - most_negative: `negative_word` is the bare lowest word ("." and "," are candidates),
          `sum_negative_attribution` its score, `negative_word_score_list` [];
        - threshold: punctuation dropped first, the remaining words numbered after the drop
          ("{i}_{word}"), every word below epsilon kept, ascending; `negative_word` their names
          joined by spaces ("" when none), the sum of their scores (0 when none), their scores;
          `word_attributions` without "." and ",".
        Added keys: `all_word_attributions` (every caption word with its score, punctuation
        included), `word_positions` (each one's index among the caption's words) and
        `lowest_word_position` (the position of the lowest non-punctuation word): what
        position-exact localisation needs when a word occurs twice."""
        positions = list(range(len(attributions))) if positions is None else list(positions)
        content = [(w, s) for w, s in attributions if w not in PUNCT]
        if self.sorted_by == "threshold":
            named = [(f"{i}_{w}", s) for i, (w, s) in enumerate(content)]
            kept = sorted([(n, s) for n, s in named if s < self.epsilon], key=lambda x: x[1])
            neg_word = " ".join(n for n, _ in kept)
            total = float(sum(s for _, s in kept)) if kept else 0.0
            score_list = [s for _, s in kept]
            word_attributions = content
        else:
            if attributions:
                lowest = min(attributions, key=lambda x: x[1])
                neg_word, total = lowest[0], float(lowest[1])
            else:
                neg_word, total = "", 0.0
            score_list = []
            word_attributions = list(attributions)
        idx = [k for k, (w, _) in enumerate(attributions) if w not in PUNCT]
        low = min(idx, key=lambda k: attributions[k][1]) if idx else None
        return {"negative_word": neg_word, "sum_negative_attribution": total,
                "negative_word_score_list": score_list, "clip_score": clip_score_from_cos(cos),
                "word_attributions": word_attributions,
                "all_word_attributions": list(attributions), "word_positions": positions,
                "lowest_word_position": None if low is None else positions[low]}


# ----------------------------------------------------------------------------- scores
def clip_score_from_cos(cos: float, w: float = 2.5) -> float:
    """CLIPScore = w * max(cos, 0) (Hessel et al.), on the templated text."""
    return float(w * max(cos, 0.0))


def f_clipscore(result: dict[str, Any]) -> float:
    """F-CLIPScore = sum of negative attributions * (1 - CLIPScore / 2.5); higher = better aligned."""
    return float(result["sum_negative_attribution"] * (1.0 - result["clip_score"] / 2.5))


def ref_clipscore(model: CLIP4DM, images, captions: Sequence[str], references: Sequence[Sequence[str]],
                  first_reference_only: bool = False, batch_size: int = 64) -> np.ndarray:
    """RefCLIPScore = harmonic mean of CLIPScore s and r = max(max_ref cos(caption, ref), 0).

    The official code uses only the first reference (`first_reference_only=True` reproduces it);
    the paper's definition, the default here, takes the maximum over all references."""
    import torch
    enc = model.encoder
    out = []
    with torch.no_grad():
        for k in range(0, len(captions), batch_size):
            ims, caps = list(images[k:k + batch_size]), [model.template + c for c in captions[k:k + batch_size]]
            refs = [list(r[:1] if first_reference_only else r) for r in references[k:k + batch_size]]
            img = enc.encode_images(ims)
            cap = enc.encode_texts(caps)
            s = 2.5 * torch.clamp((img * cap).sum(-1), min=0)
            for i, rs in enumerate(refs):
                if not rs:
                    out.append(float("nan"))
                    continue
                r = enc.encode_texts([model.template + x for x in rs])
                rmax = float(torch.clamp((r @ cap[i]).max(), min=0))
                si = float(s[i])
                out.append(0.0 if si + rmax == 0 else 2 * si * rmax / (si + rmax))
    return np.asarray(out)


# ----------------------------------------------------------------------------- benchmark metrics
def _all_words(result: dict[str, Any]) -> tuple[list[tuple[str, float]], list[int]]:
    """Every attributed caption word with its score (punctuation included) and its position."""
    attrs = result.get("all_word_attributions", result["word_attributions"])
    pos = result.get("word_positions") or list(range(len(attrs)))
    return [tuple(a) for a in attrs], list(pos)


def localization_accuracy(results: Sequence[dict[str, Any]], foil_words: Sequence[str]) -> float:
    """The official FOIL / nocaps LA: the share of foil captions whose (most_negative) bare negative
    word equals the foil word's string. Where the foil word occurs twice, a hit on the other
    occurrence counts too; `position_accuracy` does not."""
    hits = [bool(r.get("negative_word")) and _norm(r["negative_word"]) == _norm(fw) for r, fw in zip(results, foil_words)]
    return float(np.mean(hits)) if hits else float("nan")


def position_accuracy(results: Sequence[dict[str, Any]], positions: Sequence[Sequence[int]]) -> float:
    """Position-exact LA: the lowest-scoring caption word (punctuation excluded) is at a misaligned
    word's position."""
    hits = [r.get("lowest_word_position") is not None and r["lowest_word_position"] in set(p)
            for r, p in zip(results, positions)]
    return float(np.mean(hits)) if hits else float("nan")


def evaluate_foil(results: Sequence[dict[str, Any]], records) -> dict[str, float]:
    """FOIL / nocaps-FOIL (most_negative results): `la` = position-exact localisation accuracy over
    foil captions (the lowest word sits where the foil word was swapped in); `la_official_string` =
    the official string comparison; `n_repeated_foil_word` = foil captions where the foil word's
    string occurs more than once (where the two can differ); AP with the original caption as the
    positive class by CLIPScore, by the sum of negative attributions and by F-CLIPScore;
    LA chance = the mean of 1 / caption words (a uniform guess), `la_chance_content` = the mean of
    1 / content words (a guess among the words a foil can replace: the honest chance line)."""
    foil = [(r, rec) for r, rec in zip(results, records) if rec.is_foil]
    la = position_accuracy([r for r, _ in foil], [rec.misaligned_positions for _, rec in foil])
    la_s = localization_accuracy([r for r, _ in foil], [rec.misaligned_words[0] for _, rec in foil])
    rep = sum(sum(_norm(w) == _norm(rec.misaligned_words[0]) for w in caption_words(rec.caption)) > 1 for _, rec in foil)
    n_words = [len([w for w, _ in _all_words(r)[0] if w not in PUNCT]) for r, _ in foil]
    n_content = [len(content_words([w for w, _ in _all_words(r)[0]])) for r, _ in foil]
    orig = [not rec.is_foil for rec in records]
    return {"la": la, "la_official_string": la_s, "n_repeated_foil_word": int(rep),
            "la_chance": float(np.mean([1.0 / max(1, n) for n in n_words])) if n_words else float("nan"),
            "la_chance_content": float(np.mean([1.0 / max(1, n) for n in n_content])) if n_content else float("nan"),
            "ap_clipscore": average_precision([r["clip_score"] for r in results], orig),
            "ap_neg_attribution": average_precision([r["sum_negative_attribution"] for r in results], orig),
            "ap_fclipscore": average_precision([f_clipscore(r) for r in results], orig),
            "ap_chance": float(np.mean(orig)), "n_pairs": len(results), "n_foil": len(foil)}


def predicted_phrases(result: dict[str, Any], epsilon: float, merge_across_punctuation: bool = True
                      ) -> list[tuple[list[int], float, str]]:
    """Runs of adjacent caption words scoring below epsilon, as (their positions, mean score, text).

    The official `main.py` merges kept words that are adjacent once punctuation is removed (so
    "red , dog" with both kept is one phrase) and scores a phrase by the mean of its words;
    `merge_across_punctuation=False` lets punctuation end a phrase."""
    attrs, pos = _all_words(result)
    phrases, cur = [], []
    for (w, s), p in zip(attrs, pos):
        if w in PUNCT:
            if not merge_across_punctuation and cur:
                phrases.append(cur)
                cur = []
            continue
        if s < epsilon:
            cur.append((p, w, s))
        elif cur:
            phrases.append(cur)
            cur = []
    if cur:
        phrases.append(cur)
    return [([p for p, _, _ in ph], float(np.mean([s for _, _, s in ph])), " ".join(w for _, w, _ in ph))
            for ph in phrases]


def evaluate_hat(results: Sequence[dict[str, Any]], records, epsilon: float) -> dict[str, float]:
    """HAT, as the official `main.py` computes it: phrases of words below epsilon (merged across
    punctuation, scored by their mean), no fallback when none; over misaligned captions, correct
    when the lowest phrase's text is a substring of the ground-truth phrase (the flagged words
    joined); AP (misaligned = positive) on the negated score of the lowest phrase (0 when none).
    Corrected variants, labelled: `hat_la_position_exact` (every word of the lowest phrase sits
    at a flagged position, so a correct word elsewhere with the same string does not count) and
    `hat_ap_fclipscore` (AP on the negated F-CLIPScore)."""
    hits, exact, ap_scores = [], [], []
    for r, rec in zip(results, records):
        phrases = predicted_phrases(r, epsilon)
        lowest = min(phrases, key=lambda x: x[1]) if phrases else None
        ap_scores.append(-lowest[1] if lowest else 0.0)
        if not rec.is_foil:
            continue
        gt = " ".join(w for w, m in rec.token_labels if m) if rec.token_labels else " ".join(rec.misaligned_words)
        gt = " ".join(w for w in re.findall(r"[^\s.,]+", gt))
        hits.append(lowest is not None and lowest[2] in gt)
        exact.append(lowest is not None and set(lowest[0]) <= set(rec.misaligned_positions))
    pos = [rec.is_foil for rec in records]
    return {"hat_la": float(np.mean(hits)) if hits else float("nan"),
            "hat_ap": average_precision(ap_scores, pos),
            "hat_la_position_exact": float(np.mean(exact)) if exact else float("nan"),
            "hat_ap_fclipscore": average_precision([-f_clipscore(r) for r in results], pos),
            "hat_ap_chance": float(np.mean(pos)), "hat_n": len(results), "hat_n_misaligned": int(sum(pos))}


def evaluate_richhf(results: Sequence[dict[str, Any]], records, epsilon: float) -> dict[str, float]:
    """RichHF-18K: Pearson and Spearman against `misalignment_score` (higher = more misaligned) of
    the negated sum of negative attributions (`richhf_*_neg_attribution`: more negative attribution
    = more misaligned, so a positive correlation is the expected sign) and of the negated
    F-CLIPScore and CLIPScore (same sign convention). Token-level P / R / F1 of words below
    epsilon against the flagged words, by position: the compendium's own, since the official
    token code never runs (its counters are reset before use), so no official number exists."""
    from scipy.stats import pearsonr, spearmanr
    tp = fp = fn = 0
    for r, rec in zip(results, records):
        attrs, pos = _all_words(r)
        pred = {p for (w, s), p in zip(attrs, pos) if w not in PUNCT and s < epsilon}
        gold_pos = set(rec.misaligned_positions)
        tp += len(pred & gold_pos)
        fp += len(pred - gold_pos)
        fn += len(gold_pos - pred)
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec_ = tp / (tp + fn) if tp + fn else 0.0
    gold = np.asarray([rec.score for rec in records], dtype=float)
    cols = {"neg_attribution": -np.asarray([r["sum_negative_attribution"] for r in results]),
            "fclipscore": -np.asarray([f_clipscore(r) for r in results]),
            "clipscore": -np.asarray([r["clip_score"] for r in results])}
    out = {"richhf_precision": prec, "richhf_recall": rec_,
           "richhf_f1": 2 * prec * rec_ / (prec + rec_) if prec + rec_ else 0.0}
    for k, v in cols.items():
        ok = np.std(v) > 0 and np.std(gold) > 0
        out[f"richhf_pearson_{k}"] = float(pearsonr(v, gold)[0]) if ok else float("nan")
        out[f"richhf_spearman_{k}"] = float(spearmanr(v, gold)[0]) if ok else float("nan")
    return out


def predicted_phrase_text(result: dict[str, Any], epsilon: float) -> str:
    """The lowest predicted phrase as text ("" when no word is below epsilon)."""
    phrases = predicted_phrases(result, epsilon)
    return min(phrases, key=lambda x: x[1])[2] if phrases else ""


def seetrue_caption_scores(results: Sequence[dict[str, Any]], records, epsilon: float, nli_model,
                           device: str | None = None) -> np.ndarray:
    """Each caption's SeeTRUE-Feedback score: the mean over its predicted phrases (words below epsilon,
    merged across punctuation) of P(entailment) over entailment and contradiction, premise = the
    annotated misalignment, hypothesis = the phrase; 0 for a caption with no phrase."""
    phrases = [[t for _, _, t in predicted_phrases(r, epsilon)] for r in results]
    prem, hyp, owner = [], [], []
    for i, (ph, rec) in enumerate(zip(phrases, records)):
        for t in ph:
            prem.append(rec.misaligned_words[0] if rec.misaligned_words else "")
            hyp.append(t)
            owner.append(i)
    probs = nli_entailment(prem, hyp, nli_model, device) if prem else np.zeros(0)
    per = np.zeros(len(results))
    for i in range(len(results)):
        mine = [p for p, o in zip(probs, owner) if o == i]
        per[i] = float(np.mean(mine)) if mine else 0.0
    return per


def evaluate_seetrue(results: Sequence[dict[str, Any]], records, epsilon: float, nli_model, device: str | None = None,
                     per_caption: np.ndarray | None = None) -> dict[str, Any]:
    """SeeTRUE-Feedback as the official evaluation computes it: every predicted phrase scored by NLI
    against the annotated misalignment (seetrue_caption_scores; `per_caption` when already computed);
    the benchmark score is the mean over captions. Without an NLI model the score is not computed and
    the result says so."""
    phrases = [predicted_phrases(r, epsilon) for r in results]
    out: dict[str, Any] = {"seetrue_share_with_phrase": float(np.mean([bool(p) for p in phrases])) if phrases else float("nan")}
    if not nli_model and per_caption is None:
        return {**out, "seetrue_nli": None, "seetrue_note": "no NLI model configured (set nli_model, e.g. a local "
                "facebook/bart-large-mnli folder); the NLI score was not computed"}
    per = per_caption if per_caption is not None else seetrue_caption_scores(results, records, epsilon, nli_model, device)
    name = nli_model if isinstance(nli_model, str) else type(nli_model[0]).__name__ if nli_model else "(saved scores)"
    return {**out, "seetrue_nli": float(per.mean()) if len(per) else float("nan"), "seetrue_note": f"NLI model {name}"}


def main(argv: list[str] | None = None) -> int:
    """Command line, like the official infer.py: print the result dict for one image and caption."""
    ap = argparse.ArgumentParser(description="CLIP4DM: misaligned words of a caption for an image.")
    ap.add_argument("--model", default="memeworld-clip", help="encoder preset or local Hugging Face CLIP folder")
    ap.add_argument("--image", required=True)
    ap.add_argument("--caption", required=True)
    ap.add_argument("--template", default="A photo depicts ")
    ap.add_argument("--start_layer_text", type=int, default=-3)
    ap.add_argument("--sorted_by", choices=["threshold", "most_negative"], default="threshold")
    ap.add_argument("--epsilon", type=float, default=-5e-5)
    ap.add_argument("--device", default=None)
    a = ap.parse_args(argv)
    model = CLIP4DM.from_pretrained(a.model, device=a.device, template=a.template,
                                    start_layer_text=a.start_layer_text, sorted_by=a.sorted_by, epsilon=a.epsilon)
    res = model(Image.open(a.image).convert("RGB"), a.caption)
    print(json.dumps(res, indent=1))
    return 0


# ----------------------------------------------------------------------------- stored attributions, command line
def select(raw: dict[str, Any], sorted_by: str, epsilon: float) -> dict[str, Any]:
    """A result dict from stored word attributions and cosine, under any selection rule."""
    sel = CLIP4DM.__new__(CLIP4DM)
    sel.sorted_by, sel.epsilon = sorted_by, epsilon
    return CLIP4DM._select(sel, [tuple(x) for x in raw["word_attributions"]], raw["cos"], raw.get("word_positions"))


if __name__ == "__main__":
    raise SystemExit(main())
