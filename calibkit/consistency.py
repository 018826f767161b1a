"""The inputs of one run must agree, by content, before any work starts.

Every engine, calibration table, tokenizer and source model a run uses is identified by the sha256 of its bytes
(recorded by ``build`` in the engine sidecar and by ``calibrate``/``tune`` in calibration.json). This module is
the one place that compares those identities: ``compare``, sensitivity, ``tune`` and ``build`` call it, so a
Python caller of the library gets the same refusals as the command line. A mismatch is a :class:`ModelError`
(or :class:`CalibrationError` for a table) whose message names both sides and their digests.

Foundation layer: it reads files and plain attributes only (no engines, data or calibrate imports), so every
layer above may call it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from calibkit._io import read_json, sha256_file
from calibkit.errors import CalibrationError, ModelError

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnx

# files of a tokenizer folder that decide how texts become ids (others: the model, its config, readmes)
TOKENIZER_FILES = re.compile(r"(tokenizer.*|vocab.*|merges\.txt|special_tokens_map\.json|added_tokens\.json|"
                             r"spiece\.model|sentencepiece.*\.model|.*\.bpe\.model)")


def tokenizer_folder(path: str | os.PathLike[str]) -> Path:
    """The folder holding a tokenizer given as a folder or as one of its files (tokenizer.json)."""
    p = Path(path)
    return p if p.is_dir() else p.parent


def tokenizer_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 over the name and bytes of every tokenizer file of the folder (sorted by name): two folders with
    the same digest turn every text into the same ids."""
    h = hashlib.sha256()
    folder = tokenizer_folder(path)
    for f in sorted(folder.iterdir()) if folder.is_dir() else ():
        if f.is_file() and TOKENIZER_FILES.fullmatch(f.name):
            h.update(f.name.encode("utf-8", "surrogateescape") + b"\0" + bytes.fromhex(sha256_file(f)))
    return h.hexdigest()


def labels_sha256(path: str | os.PathLike[str]) -> str | None:
    """sha256 of the model folder's label names (config.json ``id2label``, keys as integers, sorted); None when
    the folder has no readable config.json with an id2label object."""
    cfg = tokenizer_folder(path) / "config.json"
    try:
        st = cfg.stat()
        key = (str(cfg.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        if key in _LABELS:
            return _LABELS[key]
        doc = read_json(cfg)
    except (OSError, ValueError, RecursionError):
        return None
    _LABELS[key] = _labels_digest(doc)
    return _LABELS[key]


_LABELS: dict[tuple[str, int, int, int], str | None] = {}


def _labels_digest(doc: object) -> str | None:
    raw = doc.get("id2label") if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        items = sorted((int(k), str(v)) for k, v in raw.items())
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


_FILE_SHA: dict[tuple[str, int, int, int], str] = {}  # (path, size, mtime_ns, inode) -> sha256: hashed once per version


def bytes_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, remembered per (path, size, mtime, inode) for the life of the process."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _FILE_SHA:
        _FILE_SHA[key] = sha256_file(p)
    return _FILE_SHA[key]


def file_sha256(path: str | os.PathLike[str]) -> str:
    """A file's identity: the sha256 of its bytes; for an ONNX model (``.onnx``), :func:`model_sha256`, which
    is the same digest unless the model keeps weights in external-data files."""
    p = Path(path)
    return model_sha256(p) if p.suffix.lower() == ".onnx" else bytes_sha256(p)


_LOCATIONS: dict[tuple[str, int, int, int], tuple[str, ...]] = {}  # model file version -> external-data names
MODEL_IDENTITY = b"calibkit-model-identity/1"


def external_data_names(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The external-data files an ONNX model names (its initializers' ``location`` entries), read without
    loading a weight; remembered per file version. A file ONNX cannot parse names none (its readers refuse it)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _LOCATIONS:
        import onnx

        try:
            with open(p, "rb") as fh:
                model = onnx.load(fh, load_external_data=False)
        except Exception:  # noqa: BLE001 - not a model: it names nothing, the readers of models say why
            _LOCATIONS[key] = ()
        else:
            _LOCATIONS[key] = external_names_of(model)
    return _LOCATIONS[key]


def external_names_of(model: onnx.ModelProto) -> tuple[str, ...]:
    """The distinct ``location`` entries of a loaded ModelProto's external initializers, sorted."""
    names: set[str] = set()
    for init in model.graph.initializer:
        if init.data_location == 1:  # onnx.TensorProto.EXTERNAL
            names.update(e.value for e in init.external_data if e.key == "location")
    return tuple(sorted(names))


def with_external_data(model_bytes_sha256: str, path: str | os.PathLike[str], names: Sequence[str]) -> str:
    """The identity of the model at ``path`` whose own bytes hash to ``model_bytes_sha256`` and which names the
    external-data files ``names``: that digest itself when it names none (so older documents still match);
    otherwise the sha256 over it and every external file's name and sha256, in sorted order (a file that is
    missing or not a regular file enters as such, so it changes the identity too)."""
    if not names:
        return model_bytes_sha256
    import stat as _stat

    folder = Path(path).parent
    h = hashlib.sha256(MODEL_IDENTITY + b"\0" + model_bytes_sha256.encode("ascii") + b"\n")
    for name in sorted(set(names)):
        f = folder / name
        try:
            st = os.lstat(f)
            digest = bytes_sha256(f) if _stat.S_ISREG(st.st_mode) else "not-a-regular-file"
        except OSError:
            digest = "missing"
        h.update(name.encode("utf-8", "surrogateescape") + b"\0" + digest.encode("ascii") + b"\n")
    return h.hexdigest()


def model_sha256(path: str | os.PathLike[str]) -> str:
    """An ONNX model's identity: the sha256 of model.onnx's bytes, extended by every external-data file it
    names (:func:`with_external_data`), so weights edited beside the model change it."""
    p = Path(path)
    return with_external_data(bytes_sha256(p), p, external_data_names(p))


def _short(sha: str | None) -> str:
    return f"{sha[:12]}…" if sha else "unknown"


class EngineLike(Protocol):
    """What the checks read of an engine (``enginefiles.artifact.EngineArtifact``, a frozen dataclass)."""

    @property
    def path(self) -> Path: ...
    @property
    def source_model_sha256(self) -> str: ...
    @property
    def calibration_sha256(self) -> str | None: ...
    @property
    def tokenizer(self) -> str | None: ...
    @property
    def source_model(self) -> str | None: ...
    @property
    def calibration_json(self) -> str | None: ...


@dataclass(frozen=True)
class Side:
    """One input of a run as the checks see it: a label for messages and its identities."""

    label: str  # e.g. "A (int8.onnx)"
    tokenizer: str | None
    tokenizer_sha256: str | None
    labels_sha256: str | None


def engine_side(label: str, engine: EngineLike) -> Side:
    """The tokenizer and label identities an engine runs with, checked against what its sidecar recorded at
    build time: tokenizer files edited or replaced since are refused (the engine's ids would not be the ones
    it was built for)."""
    tok = engine.tokenizer
    recorded_tok = _recorded(engine, "tokenizer_sha256")
    recorded_lab = _recorded(engine, "labels_sha256")
    if not tok or not tokenizer_folder(tok).is_dir():
        return Side(label, tok, recorded_tok, recorded_lab)
    now_tok, now_lab = tokenizer_sha256(tok), labels_sha256(tok)
    if recorded_tok and now_tok != recorded_tok:
        raise ModelError(
            f"the tokenizer files of {label} ({tok}) changed after it was built: the sidecar records tokenizer "
            f"sha256 {_short(recorded_tok)}, the folder now holds {_short(now_tok)}",
            hint="restore the tokenizer the engine was built with, or rebuild the engine with `calibkit build`",
        )
    if recorded_lab and now_lab != recorded_lab:
        raise ModelError(
            f"the label names (config.json id2label) of {label} ({tok}) changed after it was built: the sidecar "
            f"records {_short(recorded_lab)}, the folder now holds {_short(now_lab)}",
            hint="restore the model folder's config.json, or rebuild the engine with `calibkit build`",
        )
    return Side(label, tok, now_tok, now_lab)


def _recorded(engine: EngineLike, key: str) -> str | None:
    v = getattr(engine, key, None)
    return v if isinstance(v, str) and v else None


def check_same_encoding(sides: Sequence[Side]) -> None:
    """Every side must turn texts into the same ids and name the same labels; the first pair that differs is
    an error naming both (their folders and digests)."""
    known = [s for s in sides if s.tokenizer_sha256]
    for other in known[1:]:
        first = known[0]
        if other.tokenizer_sha256 != first.tokenizer_sha256:
            raise ModelError(
                f"{first.label} and {other.label} use different tokenizers: {first.label} reads {first.tokenizer} "
                f"(tokenizer sha256 {_short(first.tokenizer_sha256)}), {other.label} reads {other.tokenizer} "
                f"({_short(other.tokenizer_sha256)}); the same text would be fed as different token ids",
                hint="build every engine of a run from the same model folder (same tokenizer files), or rebuild "
                     "the odd one with `calibkit build MODEL --tokenizer ...`",
            )
    labelled = [s for s in sides if s.labels_sha256]
    for other in labelled[1:]:
        first = labelled[0]
        if other.labels_sha256 != first.labels_sha256:
            raise ModelError(
                f"{first.label} and {other.label} name their outputs differently: config.json id2label of "
                f"{first.tokenizer} ({_short(first.labels_sha256)}) and of {other.tokenizer} "
                f"({_short(other.labels_sha256)}) differ",
                hint="build every engine of a run from model folders with the same config.json id2label",
            )


def check_source_model(label: str, engine: EngineLike) -> None:
    """The FP32 model named by an engine's ``source_model`` must be the one it was built from (sha256 against
    ``source_model_sha256``): sensitivity and per-layer ranges rebuild variants from that file, and a model
    re-exported in place after the build would measure another model than the engine."""
    src = engine.source_model
    if not src or not Path(src).is_file():
        return
    check_file(src, engine.source_model_sha256, what=f"the source model of {label}",
               hint=f"restore {src} as it was when the engine was built, or rebuild the engine from the current "
                    "model (`calibkit calibrate` then `calibkit build`)")


def check_calibration_table(label: str, engine: EngineLike) -> None:
    """The calibration.json named by an INT8 engine must be the one that built it (sha256 against
    ``calibration_sha256``) and must have been computed for the engine's source model."""
    cal = engine.calibration_json
    if not cal or not Path(cal).is_file():
        return
    if engine.calibration_sha256:
        check_file(cal, engine.calibration_sha256, what=f"the calibration table of {label}", error=CalibrationError,
                   hint="restore that calibration.json, or rebuild the engine from the current table with "
                        "`calibkit build`")
    check_table_model(cal, engine.source_model_sha256, model_label=f"{label}'s source model")


def table_model_sha256(table_json: str | os.PathLike[str]) -> str | None:
    """The model sha256 a calibration.json records its table was computed for (None when absent or unreadable:
    the table's own loader says what is wrong with it)."""
    try:
        doc = read_json(table_json)
    except (OSError, ValueError, RecursionError):
        return None
    table = doc.get("table") if isinstance(doc, dict) else None
    sha = table.get("model_sha256") if isinstance(table, dict) else None
    return sha if isinstance(sha, str) and sha else None


def check_table_model(table_json: str | os.PathLike[str], model_sha256: str | None, *,
                      model_label: str, table_sha256: str | None = None) -> None:
    """A calibration table used with a model must have been computed for that model (by content).
    ``table_sha256``: the model sha the table records, when the caller has already parsed it."""
    recorded = table_sha256 or table_model_sha256(table_json)
    if recorded and model_sha256 and recorded != model_sha256:
        raise CalibrationError(
            f"{table_json} was computed for another model (sha256 {_short(recorded)}) than {model_label} "
            f"(sha256 {_short(model_sha256)})",
            hint="re-run `calibkit calibrate` on this model, or pass the model the table was calibrated on",
        )


def check_file(path: str | os.PathLike[str], expected_sha256: str | None, *, what: str, hint: str,
               error: type[ModelError] | type[CalibrationError] = ModelError) -> None:
    """Refuse a file whose bytes are not the ones recorded (``expected_sha256``; nothing to check when None)."""
    if not expected_sha256:
        return
    now = file_sha256(path)
    if now != expected_sha256 and not _older_model_digest(path, expected_sha256):
        raise error(
            f"{what}, {path}, was replaced since it was recorded: recorded sha256 {_short(expected_sha256)}, the "
            f"file now is {_short(now)}",
            hint=hint,
        )


def _older_model_digest(path: str | os.PathLike[str], expected_sha256: str) -> bool:
    """A document written before a model's identity covered its external data recorded the sha256 of
    model.onnx's bytes alone: still accepted for such a model (only its own bytes can be checked then)."""
    p = Path(path)
    return p.suffix.lower() == ".onnx" and bool(external_data_names(p)) and bytes_sha256(p) == expected_sha256


def check_engines(engines: Mapping[str, EngineLike], *, sources: bool = True) -> list[Side]:
    """All checks of a run over engines (``{"A": art, "B": art, ...}``): each engine's tokenizer and labels as
    built, all engines' tokenizers and labels alike, and (``sources``: the run rebuilds from them) each engine's
    source model and calibration table as recorded. Returns the sides, for callers that report them."""
    sides = [engine_side(f"{name} ({e.path.name})", e) for name, e in engines.items()]
    check_same_encoding(sides)
    if sources:
        for name, e in engines.items():
            check_source_model(f"{name} ({e.path.name})", e)
            check_calibration_table(f"{name} ({e.path.name})", e)
    return sides
