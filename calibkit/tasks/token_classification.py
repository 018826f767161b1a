"""The ``token-classification`` kind (``[batch, seq, labels]`` logits): agreement = same argmax per real token;
for BIO label sets, entity-level F1 of the candidate's entities against the reference's. Where the eval set
carries gold tags per word (:attr:`EvalSet.word_labels`), :meth:`TokenClassificationTask.gold_metrics` scores
each model against them: a word's prediction is that of its first token (the usual convention for CoNLL-style
evaluation), per-word accuracy and entity-level (exact span and type) precision, recall and F1."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from calibkit.data.evalset import EvalSet, word_label_ids
from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.base import BaseRunner
from calibkit.errors import ModelError
from calibkit.evaluate.metrics import ClassificationMetrics
from calibkit.evaluate.predict import Predicted, predict_outputs
from calibkit.evidence.intervals import Interval, proportion
from calibkit.evidence.rowfidelity import TOKEN_CLASSIFICATION, RowFidelity, reference_tags, token_rows
from calibkit.progress import ProgressCallback
from calibkit.results.runs import Fidelity, GoldResult, GoldScores, Range, finite
from calibkit.tasks.base import KindTraits, ModelFacts, TaskScore, check_same, row_cosine, share


def bio_entities(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """(start, end, type) spans of a BIO/IOB2 tag sequence; an I- without its B- starts an entity."""
    out: set[tuple[int, int, str]] = set()
    start, kind = -1, ""
    for i, t in enumerate([*tags, "O"]):
        prefix, _, typ = t.partition("-")
        continues = prefix == "I" and kind == typ and start >= 0
        if start >= 0 and not continues:
            out.add((start, i, kind))
            start, kind = -1, ""
        if prefix in ("B", "I") and not continues:
            start, kind = i, typ
    return out


@dataclass(frozen=True)
class EntityScore:
    """Micro entity-level scores of a candidate's spans against a reference's (exact span and type)."""

    tp: int
    fp: int
    fn: int

    @property
    def f1(self) -> float:
        return 1.0 if self.tp + self.fp + self.fn == 0 else 2 * self.tp / (2 * self.tp + self.fp + self.fn)

    @property
    def precision(self) -> float:
        return 1.0 if self.tp + self.fp == 0 else self.tp / (self.tp + self.fp)

    @property
    def recall(self) -> float:
        return 1.0 if self.tp + self.fn == 0 else self.tp / (self.tp + self.fn)


def entity_scores(reference: Sequence[Sequence[str]], candidate: Sequence[Sequence[str]]) -> EntityScore:
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference tag sequences vs {len(candidate)} candidate ones")
    tp = fp = fn = 0
    for r, c in zip(reference, candidate):
        er, ec = bio_entities(r), bio_entities(c)
        tp += len(er & ec)
        fp += len(ec - er)
        fn += len(er - ec)
    return EntityScore(tp, fp, fn)


def entity_f1(reference: Sequence[Sequence[str]], candidate: Sequence[Sequence[str]]) -> float:
    """Micro entity-level F1 of the candidate's spans against the reference's (exact span and type)."""
    return entity_scores(reference, candidate).f1


def first_token_positions(offsets: Sequence[Sequence[tuple[int, int]]],
                          spans: Sequence[Sequence[tuple[int, int]]]) -> list[np.ndarray]:
    """Per text, the token position of each word's first token (int64), -1 where a word has none (past the
    token limit, or characters the tokenizer drops). ``offsets``: per text, each token position's character
    span ((0, 0) for special tokens); ``spans``: per text, each word's character span."""
    if len(offsets) != len(spans):
        raise ValueError(f"token offsets of {len(offsets)} texts for word spans of {len(spans)}")
    out = []
    for offs, words in zip(offsets, spans):
        starts = [(a, j) for j, (a, b) in enumerate(offs) if b > a]  # increasing in a for every tokenizer here
        pos = np.full(len(words), -1, dtype=np.int64)
        k = 0
        for w, (ws, we) in enumerate(words):
            while k < len(starts) and starts[k][0] < ws:
                k += 1
            if k < len(starts) and starts[k][0] < we:
                pos[w] = starts[k][1]
        out.append(pos)
    return out


@dataclass(frozen=True)
class WordGold:
    """Gold tags aligned to token positions: per text, each word's first-token position (-1: not scored) and
    gold label id."""

    positions: tuple[np.ndarray, ...]
    label_ids: tuple[np.ndarray, ...]

    @property
    def words(self) -> int:
        return int(sum(int((p >= 0).sum()) for p in self.positions))

    @property
    def unscored_words(self) -> int:
        return int(sum(int((p < 0).sum()) for p in self.positions))


def align_word_labels(tokenizer: TextTokenizer, eval_set: EvalSet, labels: Sequence[str]) -> WordGold:
    """The eval set's gold word tags as the model's label ids, at their words' first token positions.
    Raises DataError for tags the model does not know."""
    ids = word_label_ids(eval_set, dict(enumerate(labels)), len(labels))
    offsets = tokenizer.token_offsets(eval_set.texts)
    positions = first_token_positions(offsets, [w.spans for w in eval_set.word_labels])
    return WordGold(tuple(positions), tuple(ids))


@dataclass(frozen=True)
class TokenGoldMetrics:
    """One model against gold word tags: per-word accuracy (Wilson 95 % interval over words) and, for BIO
    label sets, entity-level precision, recall and F1 (None otherwise)."""

    token_accuracy: float
    token_accuracy_ci: Interval
    entities: EntityScore | None
    words: int
    unscored_words: int
    gold_entities: int

    def to_dict(self) -> dict[str, object]:
        e = self.entities
        return {"token_accuracy": self.token_accuracy, "token_accuracy_ci": self.token_accuracy_ci.to_dict(),
                "entity_f1": e.f1 if e else None, "entity_precision": e.precision if e else None,
                "entity_recall": e.recall if e else None, "words": self.words,
                "unscored_words": self.unscored_words, "entities": self.gold_entities}


@dataclass(frozen=True)
class TokenClassificationTask(KindTraits):
    """A label per token (``[batch, seq, labels]`` logits): agreement = same argmax per real token; for BIO
    label sets, entity-level F1 against the reference's entities, and gold word tags scored where the eval set
    has them."""

    output_name: str
    labels: tuple[str, ...] = ()
    logits_distribution: bool = True  # outputs are logits of a class distribution (KL divergence applies)
    kind: ClassVar[str] = TOKEN_CLASSIFICATION
    per_text: ClassVar[bool] = True
    binary_agreement: ClassVar[bool] = False
    fidelity_name: ClassVar[str] = "per-token agreement"
    word_tags: ClassVar[bool] = True

    @classmethod
    def detect(cls, model: ModelFacts) -> bool:
        """A ``logits`` output with a sequence axis (or of a token classifier), or, without ``logits`` and
        encoder-named outputs, a first output with a sequence axis of a token classifier."""
        token_arch = "TokenClassification" in model.architectures
        if model.scores:
            return False
        if model.logits is not None:
            return model.rank(model.logits) == 3 or token_arch
        return not model.has_encoder_outputs and model.rank(model.first) == 3 and token_arch

    @classmethod
    def row_fidelity(cls, reference: np.ndarray, candidate: np.ndarray, *, index: np.ndarray | None = None,
                     index_rows: np.ndarray | None = None) -> RowFidelity:
        return token_rows(reference, candidate)

    @classmethod
    def row_reference(cls, values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return reference_tags(values, mask)

    @classmethod
    def terminal_fidelity(cls, fidelity: Fidelity, texts: int, interval: str = "") -> str:
        return f"per-token agreement {share(fidelity.agreement)} %"

    @property
    def is_bio(self) -> bool:
        return bool(self.labels) and all(x == "O" or x[:2] in ("B-", "I-") for x in self.labels)

    def predict(self, runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str], *, batch_size: int,
                progress: ProgressCallback | None = None, task: str = "inference") -> Predicted:
        out = predict_outputs(runner, tokenizer, texts, batch_size=batch_size, output_name=self.output_name,
                              progress=progress, task=task)
        if out.mask is None and len(texts):
            raise ModelError(f"output {self.output_name!r} has no sequence axis (shape {out.values.shape[1:]})",
                             hint="a token classifier returns logits [batch, sequence, labels]")
        return out

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        check_same(reference, candidate)
        if not len(reference.values) or reference.mask is None:
            return Fidelity(0.0, 0.0, 0.0)
        mask = reference.mask
        pa, pb = reference.values.argmax(axis=-1), candidate.values.argmax(axis=-1)
        agreement = float((pa == pb)[mask].mean()) if mask.any() else 1.0
        # per text: cosine over its real tokens' logits
        a = np.where(mask[..., None], reference.values, 0.0)
        b = np.where(mask[..., None], candidate.values, 0.0)
        cos = row_cosine(a, b)
        extra: dict[str, float] = {}
        if self.is_bio:
            tags = np.asarray(self.labels)
            ref_tags = [list(tags[p[m]]) for p, m in zip(pa, mask)]
            cand_tags = [list(tags[p[m]]) for p, m in zip(pb, mask)]
            extra["entity_f1"] = entity_f1(ref_tags, cand_tags)
        return Fidelity(agreement, float(cos.mean()), float(cos.min()), extra)

    def predictions(self, out: Predicted) -> np.ndarray | None:
        return None

    def metrics(self, out: Predicted, y_true: np.ndarray | None) -> ClassificationMetrics | None:
        return None  # gold tags are per word, not per text: see gold_metrics

    def gold_metrics(self, out: Predicted, gold: WordGold) -> TokenGoldMetrics:
        """``out`` (this task's predictions for the eval texts, in order) against gold word tags: a word's
        prediction is its first token's; words without a token position are not scored."""
        if len(gold.positions) != len(out.values):
            raise ValueError(f"gold tags of {len(gold.positions)} texts for predictions of {len(out.values)}")
        pred = out.values.argmax(axis=-1) if out.values.size else np.zeros((len(gold.positions), 0), np.int64)
        width = pred.shape[1] if pred.ndim == 2 else 0
        same: list[np.ndarray] = []
        gold_tags: list[list[str]] = []
        pred_tags: list[list[str]] = []
        names = np.asarray(self.labels) if self.labels else None
        for i, (pos, ids) in enumerate(zip(gold.positions, gold.label_ids)):
            keep = (pos >= 0) & (pos < width)
            p = pred[i, pos[keep]] if width else np.zeros(0, dtype=np.int64)
            g = ids[keep]
            same.append(p == g)
            if names is not None:
                gold_tags.append(list(names[g]))
                pred_tags.append(list(names[p]))
        hits = np.concatenate(same) if same else np.zeros(0, dtype=bool)
        ci = proportion(hits)
        scores = entity_scores(gold_tags, pred_tags) if self.is_bio else None
        n_gold = sum(len(bio_entities(t)) for t in gold_tags) if self.is_bio else 0
        return TokenGoldMetrics(float(hits.mean()) if hits.size else float("nan"), ci, scores, int(hits.size),
                                gold.unscored_words + (gold.words - int(hits.size)), n_gold)

    @property
    def tunable(self) -> str | None:
        return None  # judged on per-text fidelity (evidence.rowfidelity)

    def gold(self, eval_set: EvalSet, tokenizer: TextTokenizer | None = None, width: int | None = None
             ) -> WordGold | None:
        """The eval set's gold word tags at their words' first token positions (tags the model does not know are
        refused); without ``id2label``, by label id once ``width`` is known."""
        if not eval_set.has_word_labels or tokenizer is None:
            return None
        labels = self.labels or (tuple(str(i) for i in range(width)) if width is not None else None)
        return align_word_labels(tokenizer, eval_set, labels) if labels is not None else None

    def score(self, outputs: Mapping[str, Predicted], gold: object | None, *, seed: int = 0) -> TaskScore:
        """Each engine against the gold word tags (:meth:`gold_metrics`)."""
        if not isinstance(gold, WordGold) or not outputs:
            return TaskScore()
        per = {name: self.gold_metrics(out, gold) for name, out in outputs.items()}
        first = next(iter(per.values()))
        engines = {name: GoldResult(finite(m.token_accuracy), Range.of(m.token_accuracy_ci),
                                    m.entities.f1 if m.entities else None,
                                    m.entities.precision if m.entities else None,
                                    m.entities.recall if m.entities else None, m.words, m.unscored_words,
                                    m.gold_entities)
                   for name, m in per.items()}
        return TaskScore(gold=GoldScores(engines, first.words, first.unscored_words, first.gold_entities))
