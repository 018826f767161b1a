"""Traffic evidence is independent of the calibration and eval sets by what the model sees: texts the tokenizer
cannot tell from a calibration or eval text are excluded before the draw (so --traffic-size holds), and a log
that is the eval set is refused as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calib_helpers import WORDS, texts
from cli_helpers import build_engines
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import calibkit.api
from calibkit.cli import app
from calibkit.data.calibset import load_calibration_set, write_calibration_set
from calibkit.data.dedup import normalize
from calibkit.errors import DataError

runner = CliRunner()
CALIBRATION = ["good movie", "bad plot", "great actors"]
# each tokenizes exactly as a calibration text with a BERT-style tokenizer (clean_text, strip_accents, lowercase)
VARIANTS = ["good\u200b movie", "go\u00adod movie", "good movie\x07", "g\u00f3od movie", "BAD plot",
            "bad\ufeff plot", "gre\u0301at actors"]


def _bert_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, strip_accents=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _log(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    return path


def _distinct(n: int, seed: int) -> list[str]:
    seen: dict[str, None] = {}
    for t in texts(20 * n, seed=seed, max_words=8):
        seen.setdefault(t, None)
    return list(seen)[:n]


def test_texts_the_tokenizer_reads_as_a_calibration_text_are_excluded(tmp_path: Path) -> None:
    tok = _bert_tokenizer(tmp_path / "tok")
    cset = write_calibration_set(tmp_path / "set", CALIBRATION, None)
    others = [t for t in _distinct(40, seed=1) if t not in CALIBRATION][:30]
    log = _log(tmp_path / "log.jsonl", [*CALIBRATION, *VARIANTS, *others])
    drawn = calibkit.api.load_traffic(log, cset, size=1000, tokenizer=tok)
    assert drawn is not None
    assert set(drawn.texts) == set(others), sorted(set(drawn.texts) - set(others))
    groups = {normalize(t) for t in CALIBRATION + VARIANTS}  # "BAD plot" is a repeat of "bad plot" already
    assert drawn.excluded["calibration_set"] == len(groups) == 9
    assert drawn.population == len(others)


def test_without_a_tokenizer_control_format_characters_and_accents_still_match(tmp_path: Path) -> None:
    from calibkit.evaluate.traffic import model_view_keys

    keys = model_view_keys(["good movie", *VARIANTS[:4]], None)
    assert len(set(keys)) == 1
    assert model_view_keys(["good movies"], None) != keys[:1]


def test_traffic_size_is_honoured_when_eval_texts_are_excluded(tmp_path: Path) -> None:
    """tune drew the traffic and dropped the eval set's texts afterwards: 136 texts for --traffic-size 200 when
    253 were available."""
    cset = write_calibration_set(tmp_path / "set", CALIBRATION, None)
    pool = [t for t in _distinct(420, seed=2) if t not in CALIBRATION][:400]
    eval_texts, rest = pool[:150], pool[150:]
    log = _log(tmp_path / "log.jsonl", pool)
    drawn = calibkit.api.load_traffic(log, cset, size=200, exclude=eval_texts)
    assert drawn is not None and len(drawn) == 200 and not set(drawn.texts) & set(eval_texts)
    assert set(drawn.texts) <= set(rest) and drawn.excluded["eval_set"] == 150


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_engines(tmp_path_factory.mktemp("traffic"), calibration_texts=16, eval_texts=_distinct(30, seed=5))


def test_compare_refuses_traffic_that_is_the_eval_set(engines: Path, tmp_path: Path) -> None:
    """It was reported as independent traffic evidence (agreement on the eval set's own texts)."""
    r = runner.invoke(app, ["compare", str(engines / "e" / "fp32.onnx"), str(engines / "e" / "int8.onnx"), "-e",
                            str(engines / "eval.jsonl"), "--traffic", str(engines / "eval.jsonl"), "--no-report",
                            "--no-layers", "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 3 and "it is the eval set, not independent traffic evidence" in " ".join(r.output.split())
    assert not (tmp_path / "c.json").exists()


def test_tune_refuses_traffic_that_is_the_eval_set(engines: Path, tmp_path: Path) -> None:
    """It drew 0 traffic texts and went on with exit 0 and no warning."""
    with pytest.raises(DataError, match="it is the eval set, not independent traffic evidence"):
        calibkit.api.tune(engines / "model", load_calibration_set(engines / "set"), engines / "eval.jsonl",
                          tmp_path / "out", traffic=engines / "eval.jsonl", max_evaluations=2, sensitivity_samples=8,
                          workers=1, smooth=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("path", ["/dev/null", "folder"])
def test_a_traffic_log_that_is_not_a_file_says_what_it_is(tmp_path: Path, path: str) -> None:
    """``--traffic /dev/null`` was "not found"."""
    target = Path(path) if path.startswith("/") else tmp_path
    with pytest.raises(DataError, match="is a (character device|folder), not a log file") as err:
        calibkit.api.load_traffic(target, None)
    assert "--no-traffic" in (err.value.hint or "")


_INVISIBLE = ["\u200b", "\u00ad", "\x07", "\ufeff", "\u200d", "\u0301", "\u0308"]


@given(st.lists(st.tuples(st.integers(0, len(CALIBRATION) - 1), st.integers(0, 30), st.sampled_from(_INVISIBLE),
                          st.booleans()), min_size=1, max_size=12))
def test_any_invisible_change_to_a_calibration_text_is_excluded(tmp_path_factory: pytest.TempPathFactory,
                                                                edits: list[tuple[int, int, str, bool]]) -> None:
    """Zero-width characters, soft hyphens, controls and combining accents inserted anywhere in a calibration
    text (and its case changed): the model's tokenizer reads it as the calibration text, so it is excluded."""
    tmp = tmp_path_factory.mktemp("invisible")
    tok = _bert_tokenizer(tmp / "tok")
    cset = write_calibration_set(tmp / "set", CALIBRATION, None)
    variants = []
    for which, at, char, upper in edits:
        text = CALIBRATION[which]
        pos = at % (len(text) + 1)
        if char in "\u0301\u0308" and (pos == 0 or not text[pos - 1].isalpha()):
            continue  # a combining accent after a space or at the start is a character of its own, not an accent
        text = text[:pos] + char + text[pos:]
        variants.append(text.upper() if upper else text)
    others = ["fun plot", "dull film very", "not good actors"]
    log = _log(tmp / "log.jsonl", [*variants, *others])
    drawn = calibkit.api.load_traffic(log, cset, size=100, tokenizer=tok)
    assert drawn is not None and set(drawn.texts) == set(others), (variants, drawn.texts)
