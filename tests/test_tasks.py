"""Tasks beyond classification: sequence outputs across length buckets, embeddings, token classification."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.base import FunctionRunner
from calibkit.evaluate.predict import Predicted, predict_outputs
from calibkit.tasks import (
    ClassificationTask,
    EmbeddingTask,
    TokenClassificationTask,
    bio_entities,
    choose_task,
    entity_f1,
    retrieval_agreement,
)
from calibkit.types import TensorSpec

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


@pytest.fixture()
def tokenizer(tmp_path: Path) -> TextTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 16}))
    return TextTokenizer(tmp_path)


def _hidden_runner(dim: int = 3) -> FunctionRunner:
    """last_hidden_state[b, s, :] = (id, 2 * id, 1) per token: padding gives (0, 0, 1)."""
    def fn(feeds):  # type: ignore[no-untyped-def]
        ids = feeds["input_ids"].astype(np.float32)
        return {"last_hidden_state": np.stack([ids, 2 * ids, np.ones_like(ids)], axis=-1)[..., :dim]}

    specs = [TensorSpec("input_ids", "int64", ("batch", "seq")), TensorSpec("attention_mask", "int64", ("b", "s"))]
    return FunctionRunner(fn, specs, ["last_hidden_state"])


def test_sequence_outputs_across_length_buckets_are_padded_with_their_mask(tokenizer: TextTokenizer) -> None:
    texts = ["a", "a b c d e f", "b c", "h g f e d c b a"]  # 3, 8, 4 and 10 tokens, batches of 2
    with _hidden_runner() as r:
        out = predict_outputs(r, tokenizer, texts, batch_size=2)
    assert out.values.shape == (4, 10, 3) and out.mask is not None
    assert out.mask.sum(axis=1).tolist() == [3, 8, 4, 10]
    assert out.values[0, 1, 0] == 4.0 and out.values[0, 3:].sum() == 0.0  # "a" is id 4; padded tail is zero


def test_mean_pooling_uses_only_real_tokens(tokenizer: TextTokenizer) -> None:
    texts = ["a", "h g f e d c b a"]
    with _hidden_runner() as r:
        out = predict_outputs(r, tokenizer, texts, batch_size=2, pooling="mean")
    # "a" -> ids [2, 4, 3]: mean 3; padding (id 0) would pull it down
    assert out.values.shape == (2, 3)
    np.testing.assert_allclose(out.values[0], [3.0, 6.0, 1.0])
    ids = [2, 11, 10, 9, 8, 7, 6, 5, 4, 3]
    np.testing.assert_allclose(out.values[1], [np.mean(ids), 2 * np.mean(ids), 1.0])


def test_retrieval_agreement_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((40, 8))
    same = retrieval_agreement(ref, ref.copy(), k=5)
    assert same == (1.0, 1.0, 5)
    noisy = ref + rng.standard_normal(ref.shape) * 0.5
    top1, overlap, k = retrieval_agreement(ref, noisy, k=5)

    def neighbours(x: np.ndarray) -> list[list[int]]:
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        s = x @ x.T
        np.fill_diagonal(s, -np.inf)
        return [list(np.argsort(-row)[:5]) for row in s]

    na, nb = neighbours(ref), neighbours(noisy)
    assert top1 == pytest.approx(np.mean([a[0] == b[0] for a, b in zip(na, nb)]))
    assert overlap == pytest.approx(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(na, nb)]))
    assert 0.0 < overlap < 1.0


def test_embedding_fidelity_cosine_and_retrieval() -> None:
    rng = np.random.default_rng(1)
    ref = Predicted(rng.standard_normal((30, 16)).astype(np.float32))
    cand = Predicted(ref.values * 2.0)  # scaled: same directions, same neighbours
    f = EmbeddingTask("last_hidden_state").fidelity(ref, cand)
    assert f.cosine_min == pytest.approx(1.0) and f.agreement == 1.0
    assert f.extra["retrieval_overlap_at_k"] == 1.0 and f.extra["k"] == 10


def test_bio_entities_and_entity_f1() -> None:
    assert bio_entities(["O", "B-ENT", "I-ENT", "O", "I-ENT", "B-X"]) == {(1, 3, "ENT"), (4, 5, "ENT"), (5, 6, "X")}
    assert entity_f1([["B-ENT", "I-ENT"]], [["B-ENT", "I-ENT"]]) == 1.0
    assert entity_f1([["B-ENT", "I-ENT", "O"]], [["B-ENT", "O", "O"]]) == 0.0
    assert entity_f1([["O"]], [["O"]]) == 1.0


def test_token_fidelity_over_real_tokens_only() -> None:
    labels = ("O", "B-ENT", "I-ENT")
    ref = np.zeros((2, 4, 3), dtype=np.float32)
    ref[:, :, 0] = 1.0
    ref[0, 1] = [0, 1, 0]
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=bool)
    cand = ref.copy()
    cand[1, 3] = [0, 0, 5]  # a padded position disagrees: must not count
    cand[1, 1] = [0, 5, 0]  # a real token disagrees
    f = TokenClassificationTask("logits", labels).fidelity(Predicted(ref, mask), Predicted(cand, mask))
    assert f.agreement == pytest.approx(4 / 5)
    assert f.extra["entity_f1"] == pytest.approx(2 / 3)


def test_choose_task() -> None:
    cls = {"id2label": {"0": "neg", "1": "pos"}}
    assert choose_task({"logits": 2}, cls).kind == "classification"
    assert choose_task({"logits": 2}, cls).labels == ("neg", "pos")
    assert choose_task({"logits": 3}, {"id2label": {"0": "O"}}).kind == "token-classification"
    t = choose_task({"last_hidden_state": 3, "pooler_output": 2}, {})
    assert isinstance(t, EmbeddingTask) and (t.output_name, t.pooling) == ("last_hidden_state", "mean")
    t = choose_task({"token_embeddings": 3, "sentence_embedding": 2}, {})
    assert (t.output_name, t.pooling) == ("sentence_embedding", None)
    # a 384-wide unnamed output without id2label is an embedding, not 384 classes
    assert choose_task({"output_0": 2}, {}).kind == "embedding"
    assert choose_task({"output_0": 2}, cls).kind == "classification"
    assert choose_task({"logits": 2}, cls, kind="embedding").kind == "embedding"


def test_classification_metrics_only_with_labels() -> None:
    t = ClassificationTask("logits", ("neg", "pos"))
    out = Predicted(np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32))
    assert t.metrics(out, None) is None
    m = t.metrics(out, np.array([0, 0]))
    assert m is not None and m.accuracy == 0.5


# ---------------------------------------------------------------- gold word tags (NER)

TAGS = ("O", "B-ENT", "I-ENT")


def _word_set(tmp_path: Path, rows: list[tuple[str, list[str]]]):  # type: ignore[no-untyped-def]
    from calibkit.data.evalset import load_eval_set

    p = tmp_path / "ner.jsonl"
    p.write_text("".join(json.dumps({"text": t, "tags": g}) + "\n" for t, g in rows))
    return load_eval_set(p)


def _tagger() -> FunctionRunner:
    """logits[b, s] one-hot: token "a" (id 4) -> B-ENT, "b" (id 5) -> I-ENT, anything else -> O."""
    def fn(feeds):  # type: ignore[no-untyped-def]
        ids = feeds["input_ids"]
        cls = np.where(ids == 4, 1, np.where(ids == 5, 2, 0))
        return {"logits": np.eye(3, dtype=np.float32)[cls]}

    specs = [TensorSpec("input_ids", "int64", ("batch", "seq")), TensorSpec("attention_mask", "int64", ("b", "s"))]
    return FunctionRunner(fn, specs, ["logits"])


def test_words_map_to_their_first_token_and_words_past_the_limit_are_unscored(
        tokenizer: TextTokenizer, tmp_path: Path) -> None:
    from calibkit.tasks import align_word_labels, first_token_positions

    long = " ".join(["c"] * 20)
    ev = _word_set(tmp_path, [("a b. c", ["O"] * 3), ("c  ,d", ["O", "O"]), (long, ["O"] * 20)])
    gold = align_word_labels(tokenizer, ev, TAGS)
    # [CLS] a b . c [SEP]: "b." is two tokens, its first is position 2; ",d" starts with an [UNK] comma
    assert gold.positions[0].tolist() == [1, 2, 4] and gold.positions[1].tolist() == [1, 2]
    # model_max_length 16: [CLS] + 14 words + [SEP]; the last 6 words have no position
    assert gold.positions[2].tolist() == list(range(1, 15)) + [-1] * 6
    assert gold.words == 3 + 2 + 14 and gold.unscored_words == 6
    # brute force: the first token whose start lies inside the word
    offs = tokenizer.token_offsets(ev.texts)
    for o, w, got in zip(offs, [x.spans for x in ev.word_labels], first_token_positions(offs, [x.spans for x in
                                                                                              ev.word_labels])):
        want = [next((j for j, (a, b) in enumerate(o) if b > a and s <= a < e), -1) for s, e in w]
        assert got.tolist() == want


def test_gold_metrics_per_word_accuracy_and_entity_f1(tokenizer: TextTokenizer, tmp_path: Path) -> None:
    from calibkit.tasks import align_word_labels, entity_scores

    rows = [("a b c", ["B-ENT", "I-ENT", "O"]),  # all right
            ("c a. d", ["O", "B-ENT", "O"]),  # "a." is scored by its first token "a": right
            ("c b", ["O", "O"]),  # predicts I-ENT on "b": one wrong word, one spurious entity
            ("a c", ["B-ENT", "I-ENT"]),  # entity cut short: one wrong word, a missed and a spurious entity
            (" ".join(["c"] * 20), ["O"] * 20)]  # 14 scored, all right; 6 past the limit
    ev = _word_set(tmp_path, rows)
    task = TokenClassificationTask("logits", TAGS)
    with _tagger() as r:
        out = task.predict(r, tokenizer, ev.texts, batch_size=2)
    m = task.gold_metrics(out, align_word_labels(tokenizer, ev, TAGS))
    assert (m.words, m.unscored_words, m.gold_entities) == (24, 6, 3)
    assert m.token_accuracy == pytest.approx(22 / 24) and m.token_accuracy_ci.low < 22 / 24 < m.token_accuracy_ci.high
    assert m.entities is not None and (m.entities.tp, m.entities.fp, m.entities.fn) == (2, 2, 1)
    assert m.entities.f1 == pytest.approx(4 / 7) and m.entities.precision == 0.5
    assert m.entities.recall == pytest.approx(2 / 3)
    assert entity_scores([["B-ENT"]], [["O"]]).f1 == 0.0
    d = m.to_dict()
    assert d["entity_f1"] == pytest.approx(4 / 7) and d["words"] == 24


def test_gold_metrics_without_bio_labels_give_accuracy_only(tokenizer: TextTokenizer, tmp_path: Path) -> None:
    from calibkit.tasks import align_word_labels

    ev = _word_set(tmp_path, [("a b c", ["NOUN", "VERB", "X"])])
    task = TokenClassificationTask("logits", ("X", "NOUN", "VERB"))
    with _tagger() as r:
        m = task.gold_metrics(task.predict(r, tokenizer, ev.texts, batch_size=2),
                              align_word_labels(tokenizer, ev, task.labels))
    assert m.token_accuracy == 1.0 and m.entities is None and m.to_dict()["entity_f1"] is None


def test_score_heads_are_regression_not_argmax() -> None:
    from calibkit.evaluate.predict import Predicted
    from calibkit.tasks import RegressionTask, choose_task

    assert choose_task({"logits": 2}, {"problem_type": "regression", "id2label": {"0": "LABEL_0"}}).kind \
        == "regression"
    assert choose_task({"logits": 2}, {"id2label": {"0": "score"}}).kind == "regression"
    assert choose_task({"logits": 2}, {"id2label": {"0": "a", "1": "b"}}).kind == "classification"
    assert choose_task({"logits": 2}, {}, "regression").kind == "regression"
    rng = np.random.default_rng(0)
    a = rng.normal(size=(200, 1))
    task = RegressionTask("logits")
    same = task.fidelity(Predicted(a), Predicted(a.copy()))
    assert same.agreement == 1.0 and same.extra["max_abs_error"] == 0.0 and same.cosine_min == pytest.approx(1.0)
    noisy = task.fidelity(Predicted(a), Predicted(a + rng.normal(size=a.shape) * 0.02))  # 2 % of the spread
    assert 0.2 < noisy.agreement < 0.6  # |N(0, 0.02)| <= 0.01: about 38 %
    assert noisy.extra["spearman"] > 0.99 and task.predictions(Predicted(a)) is None


def test_multi_label_heads_compare_label_sets_not_argmax() -> None:
    from calibkit.evaluate.predict import Predicted
    from calibkit.tasks import MultiLabelTask, choose_task

    cfg = {"problem_type": "multi_label_classification", "id2label": {str(i): f"l{i}" for i in range(4)}}
    assert choose_task({"logits": 2}, cfg).kind == "multi-label"
    a = np.array([[2.0, -1.0, 0.5, -3.0], [1.0, 1.2, -1.0, -1.0], [-2.0, -1.0, -0.5, -0.1]])
    b = a.copy()
    b[0, 2] = -0.1  # a label switched off: the argmax is unchanged
    b[2, 3] = 0.3  # a label switched on
    fid = MultiLabelTask("logits").fidelity(Predicted(a), Predicted(b))
    assert fid.agreement == pytest.approx(1 / 3)  # argmax agreement would say 2 of 3
    assert fid.extra["label_decision_agreement"] == pytest.approx(10 / 12)
