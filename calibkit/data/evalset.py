"""Evaluation sets: JSONL, CSV/TSV, Parquet, or a Hugging Face ``datasets`` folder.

Labels may be class names or class ids; :func:`label_ids` maps them onto a model's ``id2label``. A set without a
label column is accepted (``labels == ()``, :attr:`EvalSet.has_labels` False): fidelity to the reference model
needs no labels; accuracy is reported only where they exist.

Token-labelled sets (named-entity recognition): one tag per word, as CoNLL-style datasets ship them — a
``tokens`` list of words with a ``ner_tags`` list (``datasets``' ``Sequence(ClassLabel)`` ids become the
dataset's tag names), or a ``text`` with a ``tags`` / ``ner_tags`` / ``labels`` list aligned to its whitespace
words. They load as :attr:`EvalSet.word_labels` (the text is the words joined by single spaces); a row whose
tag count differs from its word count is refused with its row number.
"""

from __future__ import annotations

import json
import logging
import math
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from calibkit._deps import require
from calibkit._io import file_kind, text_lines
from calibkit.data.textcheck import has_lone_surrogate, is_usable, is_utf16, utf16_hint
from calibkit.errors import DataError

log = logging.getLogger("calibkit.data.evalset")

TEXT_COLUMNS = ("text", "sentence", "review", "content")
LABEL_COLUMNS = ("label", "labels", "sentiment", "target")
WORD_COLUMNS = ("tokens", "words")  # a list of words per row (CoNLL-style datasets)
TAG_COLUMNS = ("ner_tags", "tags", "labels", "label")  # a list of tags per row, one per word
_FORMATS = "JSONL (.jsonl/.json), CSV (.csv/.tsv), Parquet (.parquet) or a Hugging Face datasets folder"


@dataclass(frozen=True)
class WordLabels:
    """Gold tags of one text, one per word: ``spans`` are the words' (start, end) character offsets in the
    text, ``tags`` their tags as written (names or ids, as strings)."""

    spans: tuple[tuple[int, int], ...]
    tags: tuple[str, ...]


@dataclass(frozen=True)
class EvalSet:
    """Texts with their labels as written in the file (names or ids, as strings); ``labels`` is empty when the
    file has no label column. ``word_labels``: per text, gold tags of its words (token-labelled sets), else
    empty."""

    path: Path
    texts: tuple[str, ...]
    labels: tuple[str, ...]
    word_labels: tuple[WordLabels, ...] = ()

    def __post_init__(self) -> None:
        if self.word_labels and len(self.word_labels) != len(self.texts):
            raise ValueError(f"{len(self.word_labels)} rows of word labels for {len(self.texts)} texts")

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def has_labels(self) -> bool:
        return len(self.labels) == len(self.texts) and len(self.texts) > 0

    @property
    def has_word_labels(self) -> bool:
        return len(self.word_labels) == len(self.texts) and len(self.texts) > 0

    def take(self, indices: Sequence[int]) -> EvalSet:
        """The rows ``indices``, with their labels and word labels."""
        idx = [int(i) for i in indices]
        return replace(self, texts=tuple(self.texts[i] for i in idx),
                       labels=tuple(self.labels[i] for i in idx) if self.labels else (),
                       word_labels=tuple(self.word_labels[i] for i in idx) if self.word_labels else ())

    def head(self, n: int | None) -> EvalSet:
        """The first ``n`` examples (all when ``n`` is None)."""
        if n is None or n >= len(self.texts):
            return self
        if n <= 0:
            raise DataError(f"--limit must be positive, got {n}")
        return self.take(range(n))


def load_eval_set(
    path: str | Path,
    *,
    text_column: str | None = None,
    label_column: str | None = None,
    split: str | None = None,
    label_sets: bool = False,
) -> EvalSet:
    """Read an eval set. Columns default to the first of ``text``/``sentence``/... and ``label``/``labels``/...

    ``split`` picks a split of a ``datasets`` DatasetDict folder (default: test, then validation).
    ``label_sets`` (multi-label models): a list in the label column is the example's set of labels (names or ids,
    or a multi-hot 0/1 vector), not one tag per word; each label is then the set joined by :data:`SET_SEPARATOR`.
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"eval set not found: {p}", hint=f"pass {_FORMATS}")
    if p.is_dir():
        if (p / "texts.jsonl").is_file():  # a calibration-set folder with labels
            rows = _read_jsonl(p / "texts.jsonl")
        else:
            rows = _read_hf_dataset(p, split)
    else:
        mode = p.stat().st_mode
        if not stat.S_ISREG(mode):  # read whole: a FIFO would block for good, /dev/zero fill the memory
            raise DataError(f"eval set {p} is {file_kind(mode)}, not a file",
                            hint=f"save the eval set to a file first, then pass that file ({_FORMATS})")
        suffix = p.suffix.lower()
        if suffix in _TEXT_SUFFIXES and _utf16(p):
            raise DataError(f"eval set {p} is UTF-16 text; calibkit reads eval sets in UTF-8", hint=utf16_hint(p))
        if suffix in (".jsonl", ".json", ".ndjson"):
            rows = _read_jsonl(p)
        elif suffix in (".csv", ".tsv", ".parquet", ".pq"):
            rows = _read_polars(p, suffix)
        else:
            raise DataError(f"eval set {p}: unknown format {suffix!r}", hint=f"pass {_FORMATS}")
    return _to_eval_set(p, rows, text_column, label_column, label_sets)


_TEXT_SUFFIXES = (".jsonl", ".json", ".ndjson", ".csv", ".tsv")


def _utf16(p: Path) -> bool:
    with open(p, "rb") as fh:
        return is_utf16(fh.read(16))


SET_SEPARATOR = "\x1f"  # joins the labels of a multi-label example (no label name holds a unit separator)


def _label_set(value: object, p: Path, n: int) -> str:
    if not isinstance(value, list):
        value = [value]
    if value and all(isinstance(v, int) and not isinstance(v, bool) and v in (0, 1) for v in value) and len(value) > 1:
        value = [i for i, v in enumerate(value) if v == 1]  # multi-hot
    names = [_tag_text(v) for v in value]
    if any(v is None for v in names):
        raise DataError(f"eval set {p.name}: example {n}: the label set {value!r} holds a value that is neither a "
                        "label name nor an id", hint="a list of label names or ids, or a 0/1 vector per label")
    return SET_SEPARATOR.join(sorted(set(str(v) for v in names)))


def label_ids(eval_set: EvalSet, id2label: Mapping[int, str], num_classes: int) -> np.ndarray:
    """Class ids (int64) for the eval set's labels, by name (exact, then case-insensitive) or by id.

    Raises DataError naming the labels the model does not know.
    """
    return map_labels(eval_set.labels, id2label, num_classes, f"eval set {eval_set.path.name}", "labels")


def word_label_ids(eval_set: EvalSet, id2label: Mapping[int, str], num_labels: int) -> list[np.ndarray]:
    """Per text, the model's label ids (int64) of its words' gold tags (by name or id, as :func:`label_ids`).

    Raises DataError naming the tags the model does not know.
    """
    flat = [t for w in eval_set.word_labels for t in w.tags]
    ids = map_labels(flat, id2label, num_labels, f"eval set {eval_set.path.name}", "word tags")
    out, start = [], 0
    for w in eval_set.word_labels:
        out.append(ids[start:start + len(w.tags)])
        start += len(w.tags)
    return out


def map_labels(values: Sequence[str], id2label: Mapping[int, str], num_classes: int, where: str,
               what: str = "labels") -> np.ndarray:
    """Ids (int64) of label names or ids against a model's ``id2label``; DataError naming the unknown ones."""
    names = {str(v): k for k, v in id2label.items()}
    lower = {str(v).lower(): k for k, v in id2label.items()}
    known_ids = set(id2label) if id2label else set(range(num_classes))
    out = np.empty(len(values), dtype=np.int64)
    unknown: dict[str, int] = {}
    for i, lab in enumerate(values):
        key = lab.strip()
        if key in names:
            out[i] = names[key]
            continue
        if key.lower() in lower:
            out[i] = lower[key.lower()]
            continue
        as_id = _as_int(key)
        if as_id is not None and as_id in known_ids and as_id < num_classes:
            out[i] = as_id
            continue
        unknown[lab] = unknown.get(lab, 0) + 1
    if unknown:
        shown = ", ".join(f"{_clip(k)} ({v}x)" for k, v in list(unknown.items())[:8])
        if id2label:
            hint = (f"the model's labels (config.json id2label) are: {describe_labels(id2label)}; use those names "
                    "or ids")
        else:  # nothing names the classes: only their positions in the output are known
            hint = (f"the model folder's config.json names no labels (no id2label), so labels must be class ids "
                    f"0..{num_classes - 1}; or add id2label to config.json")
        raise DataError(f"{where}: {sum(unknown.values())} {what} the model does not know: {shown}", hint=hint)
    return out


def _clip(v: str, quote: bool = True, n: int = 40) -> str:
    r = repr(v) if quote else v
    return r if len(r) <= n else r[: n - 1] + "…"


def describe_labels(id2label: Mapping[int, str], limit: int = 12) -> str:
    """``0=negative, 1=positive`` for a message: at most ``limit`` labels, each clipped, then how many more (a
    config of a million labels made a 16 MB hint)."""
    shown = ", ".join(f"{k}={_clip(str(id2label[k]), quote=False)}" for k in sorted(id2label)[:limit])
    return shown + (f", … ({len(id2label)} labels in all)" if len(id2label) > limit else "")


def _as_int(s: str) -> int | None:
    try:
        f = float(s)
    except ValueError:
        return None
    return _whole(f)  # "NaN", "inf", "1e999": no class id


def _decoded(p: Path) -> str:
    """The file as text, bytes that are not UTF-8 counted and named (:func:`decode_counted`)."""
    from calibkit.data.textcheck import decode_counted

    return decode_counted(p.read_bytes(), f"eval set {p.name}")


def _read_jsonl(p: Path) -> list[dict[str, Any]]:
    text = _decoded(p)
    stripped = text.lstrip()
    if stripped.startswith("["):  # a JSON array of records
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p}: not valid JSON ({exc.msg})") from exc
        except RecursionError:
            raise DataError(f"{p}: JSON nested too deeply to read", hint="one flat object per example") from None
        except ValueError as exc:  # Python refuses integers of over 4,300 digits
            raise _too_long(f"{p}", exc) from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataError(f"{p}: expected a list of objects")
        return data
    rows = []
    for n, line in enumerate(text_lines(text), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p}:{n}: not valid JSON ({exc.msg})", hint="one JSON object per line") from exc
        except RecursionError:
            raise DataError(f"{p}:{n}: JSON nested too deeply to read", hint="one flat object per line") from None
        except ValueError as exc:
            raise _too_long(f"{p}:{n}", exc) from None
        if not isinstance(rec, dict):
            raise DataError(f"{p}:{n}: expected a JSON object with text and label")
        rows.append(rec)
    return rows


def _too_long(where: str, exc: ValueError) -> DataError:
    first = str(exc).split(";")[0]
    return DataError(f"{where}: a number too long to read ({first})",
                     hint="write each label as a class id or a label name; a number of thousands of digits is neither")


def _read_polars(p: Path, suffix: str) -> list[dict[str, Any]]:
    import polars as pl

    try:
        if suffix == ".csv":
            df = pl.read_csv(p, infer_schema_length=0)  # every column as text: labels stay as written
        elif suffix == ".tsv":
            # quoted fields as in CSV: a text may hold tabs, newlines or "" (an escaped quote) inside quotes
            df = pl.read_csv(p, separator="\t", infer_schema_length=0, quote_char='"')
        else:
            df = pl.read_parquet(p)
    except Exception as exc:  # polars raises many unrelated exception types
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        hint = ("re-encode the file as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8, naming the encoding it is in)"
                if "utf-8" in first.lower() or "utf8" in first.lower() else
                "check the file's quoting (a field that opens a quote must close it) and its header row; or convert "
                "it to JSON Lines")
        raise DataError(f"cannot read eval set {p}: {first}",  # polars' advice below the first line is for coders
                        hint=hint) from exc
    return df.to_dicts()


def _read_hf_dataset(p: Path, split: str | None) -> list[dict[str, Any]]:
    datasets = require("datasets")
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as exc:
        raise DataError(f"{p} is not a Hugging Face datasets folder ({exc})", hint=f"pass {_FORMATS}") from exc
    if isinstance(ds, datasets.DatasetDict):
        wanted = [split] if split else ["test", "validation", "eval"]
        chosen = next((s for s in wanted if s in ds), None)
        if chosen is None:
            raise DataError(
                f"{p}: no split {' / '.join(wanted)} in the dataset (it has {sorted(ds)})",
                hint="pick one with --split",
            )
        ds = ds[chosen]
    # ClassLabel columns come back as ids; the model's id2label names them. Lists of ClassLabel (ner_tags) come
    # back as the dataset's tag names: a word's tag is matched to the model's labels by name
    rows = ds.to_list()
    for col, feat in ds.features.items():
        inner = getattr(feat, "feature", None)
        if isinstance(feat, list) and len(feat) == 1:
            inner = feat[0]
        if isinstance(inner, datasets.ClassLabel):
            for r in rows:
                if isinstance(r.get(col), list):
                    r[col] = [inner.int2str(v) if isinstance(v, int) and v >= 0 else v for v in r[col]]
    return rows


def _pick(columns: Sequence[str], wanted: str | None, defaults: Sequence[str], what: str, p: Path) -> str:
    if wanted:
        if wanted not in columns:
            raise DataError(f"eval set {p.name}: no {what} column {wanted!r} (columns: {list(columns)})")
        return wanted
    for c in defaults:
        if c in columns:
            return c
    raise DataError(
        f"eval set {p.name}: no {what} column (looked for {', '.join(defaults)}; columns: {list(columns)})",
        hint=f"name it with --{what}-column",
    )


def _list_column(row: dict[str, Any], wanted: str | None, defaults: Sequence[str]) -> str | None:
    """The column holding a list in ``row``: ``wanted`` when it does, else the first of ``defaults``."""
    if wanted:
        return wanted if isinstance(row.get(wanted), list) else None
    return next((c for c in defaults if isinstance(row.get(c), list)), None)


def _whole(value: float) -> int | None:
    """The integer a float stands for (2.0 -> 2); None for a fraction, NaN or an infinity (no class id)."""
    return int(value) if math.isfinite(value) and value == int(value) else None


def _tag_text(value: object) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        whole = _whole(value)
        return None if whole is None else str(whole)
    if isinstance(value, (str, int)):
        s = str(value).strip()
        return s or None
    return None


def _to_word_eval_set(p: Path, rows: list[dict[str, Any]], text_col: str | None, tag_col: str) -> EvalSet:
    """A token-labelled set: per row a list of words (``tokens``) or a text split at whitespace, and a list of
    tags of the same length."""
    first = rows[0]
    wc = _list_column(first, text_col, WORD_COLUMNS)
    tc = None if wc else _pick(list(first), text_col, TEXT_COLUMNS, "text", p)
    source = wc or tc
    texts: list[str] = []
    words: list[WordLabels] = []
    hint = (f"one tag per word: CoNLL style, a {WORD_COLUMNS[0]!r} list of words and a {tag_col!r} list of as many "
            f"tags, or a text whose whitespace-separated words the {tag_col!r} list tags one by one")
    for n, r in enumerate(rows, 1):
        tags = r.get(tag_col)
        if not isinstance(tags, list):
            raise DataError(f"eval set {p.name}: example {n} has no list of tags in column {tag_col!r} (example 1 "
                            f"has one)", hint=hint)
        if wc:
            ws = r.get(wc)
            if not isinstance(ws, list) or not all(isinstance(w, str) for w in ws):
                raise DataError(f"eval set {p.name}: example {n}: column {wc!r} is not a list of words", hint=hint)
            spans, pos = [], 0
            for w in ws:
                spans.append((pos, pos + len(w)))
                pos += len(w) + 1
            t = " ".join(ws)
        else:
            raw = r.get(tc) if tc else None
            if not isinstance(raw, str):
                raise DataError(f"eval set {p.name}: example {n} has no text in column {tc!r}")
            t = raw
            spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", t)]
        if len(tags) != len(spans):
            raise DataError(
                f"eval set {p.name}: example {n} has {len(tags)} tags in {tag_col!r} for {len(spans)} words in "
                f"{source!r}: tags and words are misaligned", hint=hint)
        if not is_usable(t):
            raise DataError(f"eval set {p.name}: example {n} has no usable text in column {source!r}",
                            hint="remove or fix that example")
        if has_lone_surrogate(t):
            raise DataError(f"eval set {p.name}: example {n}: its text holds a lone UTF-16 surrogate (e.g. "
                            "\\udc00), which no tokenizer accepts", hint="fix the encoding of that example")
        as_text = [_tag_text(v) for v in tags]
        bad = next((i for i, v in enumerate(as_text) if v is None), None)
        if bad is not None:
            raise DataError(f"eval set {p.name}: example {n}: tag {bad + 1} ({tags[bad]!r}) of word "
                            f"{t[spans[bad][0]:spans[bad][1]]!r} is neither a tag name nor an id", hint=hint)
        texts.append(t)
        words.append(WordLabels(tuple(spans), tuple(v for v in as_text if v is not None)))
    return EvalSet(path=p, texts=tuple(texts), labels=(), word_labels=tuple(words))


def _to_eval_set(p: Path, rows: list[dict[str, Any]], text_col: str | None, label_col: str | None,
                 label_sets: bool = False) -> EvalSet:
    if not rows:
        raise DataError(f"eval set {p} holds no examples")
    # the columns of every row, not of the first: a set whose first example had no label was read as unlabelled
    columns = list(dict.fromkeys(c for r in rows for c in r))
    probe = next((r for r in rows if any(r.get(c) is not None for c in ([label_col] if label_col else TAG_COLUMNS))),
                 rows[0])
    tag_col = None if label_sets else _list_column(probe, label_col, TAG_COLUMNS)
    if tag_col is not None:  # one tag per word (NER): a list-valued label column
        return _to_word_eval_set(p, rows, text_col, tag_col)
    tc = _pick(columns, text_col, TEXT_COLUMNS, "text", p)
    # no label column at all: an unlabeled set (fidelity only); a named --label-column must exist
    lc = _pick(columns, label_col, LABEL_COLUMNS, "label", p) if label_col or any(
        c in columns for c in LABEL_COLUMNS) else None
    texts: list[str] = []
    labels: list[str] = []
    unlabelled: list[int] = []
    for n, r in enumerate(rows, 1):
        t = r.get(tc)
        if not isinstance(t, str):
            raise DataError(f"eval set {p.name}: example {n} has no text in column {tc!r}")
        if not is_usable(t):
            raise DataError(f"eval set {p.name}: example {n} has no usable text in column {tc!r} (empty, or only "
                            "zero-width, format or control characters)", hint="remove or fix that example")
        if has_lone_surrogate(t):
            raise DataError(f"eval set {p.name}: example {n}: its text holds a lone UTF-16 surrogate (e.g. "
                            "\\udc00), which no tokenizer accepts", hint="fix the encoding of that example")
        if lc is None:
            texts.append(t)
            continue
        lab = r.get(lc)
        if label_sets and isinstance(lab, list):
            texts.append(t)
            labels.append(_label_set(lab, p, n))
            continue
        if lab is None or (isinstance(lab, str) and not lab.strip()):
            unlabelled.append(n)
            continue
        if isinstance(lab, bool) or isinstance(lab, (list, dict)):
            raise DataError(f"eval set {p.name}: example {n}: label {lab!r} is neither a class name nor an id")
        if isinstance(lab, float) and not math.isfinite(lab):  # NaN / Infinity in JSON, a float column
            raise DataError(f"eval set {p.name}: example {n}: label {lab} is not a finite number (neither a class "
                            "name, a class id nor a score)", hint="fix or remove that example's label")
        texts.append(t)
        whole = _whole(lab) if isinstance(lab, float) else None
        labels.append(str(whole) if whole is not None else str(lab))
    if unlabelled:
        _refuse_partly_labelled(p, lc, unlabelled, len(rows))
    return EvalSet(path=p, texts=tuple(texts), labels=tuple(labels))


def _refuse_partly_labelled(p: Path, column: str | None, unlabelled: Sequence[int], total: int) -> None:
    """A set with labels on some examples only is refused (rather than read as labelled rows plus traffic): which
    rows are meant to be scored is the user's call."""
    shown = ", ".join(map(str, unlabelled[:5])) + (" …" if len(unlabelled) > 5 else "")
    verb = "has" if len(unlabelled) == 1 else "have"
    raise DataError(f"eval set {p.name}: {len(unlabelled)} of {total} examples {verb} no label in column {column!r} "
                    f"(example {shown}); an eval set is labelled in every example or in none",
                    hint=f"label those examples, or remove {column!r} from every example to judge on fidelity to "
                    "FP32 alone (unlabelled texts can also come as --traffic)")
