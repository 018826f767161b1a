"""The JSON documents of calibkit's results: written from the typed results and parsed back into the SAME types.

One format tag per document kind, defined here (:data:`FORMATS`). The mapping between a result and its JSON
is generic: a dataclass is an object whose keys are its field names, a tuple a list, a ``Mapping[str, X]`` an
object, an enum its value; a field whose metadata says ``flatten`` has its entries (a mapping's, or a dataclass's
fields: an optional one is None when the document holds none of them) beside the other keys; a
field marked ``json=False`` is left out; a field declared ``init=False`` (derived from the others) is written
and recomputed, not read. So ``parse(to_document(r)) == r`` for every result (tests check it over random
results), and a field added to ``results.runs`` needs no code here.

The documents: compare's and tune's reports (:data:`REPORTS`, what ``calibkit report`` renders), and the
documents of what ships, tune's ``plan.json`` and deploy's ``deploy.json`` (``results.documents``), each read
back as its own type by :func:`load_typed`.

Parsing is strict about types (a document names what is wrong, with its JSON path) and lenient about absence
only where the result type has a default (older documents lack newer keys). A number that is not finite (NaN,
infinity: Python's ``json`` writes them) is None where the field is optional, and refused elsewhere.

``strict=False`` reads what ``calibkit report`` renders: documents a user edited by hand or an older version
wrote. A missing key then reads as absent where its type has an empty value (None, an empty list or mapping,
``""``, 0, false, a nested object built the same way), and an older version of a known format tag is read with
a warning. A mistyped value, or a missing number or enum with no empty value, is still refused, naming the
file (``source``) and the field. A newer version is refused in both modes, naming both versions.

A file (:func:`load_result`, :func:`load_document`) is checked further before it is used: its size
(:data:`MAX_DOCUMENT_BYTES`, checked before it is parsed), its whole numbers (:data:`MAX_INT`, at most
:data:`MAX_INT_DIGITS` digits in the text) and every value's domain (:func:`check_domains`: shares in [0, 1],
cosines in [-1, 1], counts and magnitudes >= 0).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
import math
import os
import re
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from calibkit.errors import DataError
from calibkit.results.documents import DeployResult, PlanDocument
from calibkit.results.files import (
    CalibrationDocument,
    CalibrationSetManifest,
    DemoSummary,
    EngineSidecar,
    SmoothingRecord,
    TrtProfiles,
)
from calibkit.results.runs import Comparison, Result, TuneResult
from calibkit.types import CalibrationTable

COMPARE_FORMAT = "calibkit-compare/1"
TUNE_FORMAT = "calibkit-tune/1"
PLAN_FORMAT = "calibkit-plan/2"
DEPLOY_FORMAT = "calibkit-deploy/2"
FORMATS: dict[type, str] = {Comparison: COMPARE_FORMAT, TuneResult: TUNE_FORMAT, PlanDocument: PLAN_FORMAT,
                            DeployResult: DEPLOY_FORMAT}
REPORTS: tuple[type, ...] = (Comparison, TuneResult)  # what `calibkit report` renders
Document = Result | PlanDocument | DeployResult
T = TypeVar("T")
KINDS: dict[str, type] = {fmt.partition("/")[0]: cls for cls, fmt in FORMATS.items()}

log = logging.getLogger("calibkit.report")
_D = typing.TypeVar("_D")

#: the largest report file read: a compare of a thousand-layer model with every list at its cap is a few MB
MAX_DOCUMENT_BYTES = 64 << 20
#: the largest whole number a document holds (int64), and the most digits read for one
MAX_INT = (1 << 63) - 1
MAX_INT_DIGITS = 19


def format_of(result: Document) -> str:
    return FORMATS[type(result)]


def to_document(result: Document) -> dict[str, Any]:
    """The JSON document of a result: ``{"format": ..., **fields}``."""
    if type(result) not in FORMATS:
        raise TypeError(f"{type(result).__name__} has no document format")
    return {"format": FORMATS[type(result)], **to_json(result)}


def dumps(result: Document) -> str:
    from calibkit._io import dumps_json

    return dumps_json(to_document(result))


def to_json(value: object) -> Any:
    """Plain JSON values (dict, list, str, float, int, bool, None) of a result or any value inside one."""
    if isinstance(value, CalibrationTable):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if f.metadata.get("json", True) is False:
                continue
            v = getattr(value, f.name)
            if v is None and f.metadata.get("omit_if_none"):
                continue
            if "written_with" in f.metadata and getattr(value, f.metadata["written_with"]) is None:
                continue
            if f.metadata.get("flatten"):  # a mapping's entries, or a dataclass's fields, beside the other keys
                if v is not None:
                    out.update(to_json(v))
            else:
                out[f.name] = to_json(v)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def parse_result(doc: object, *, strict: bool = True, source: str | Path | None = None) -> Any:
    """A calibkit document (a parsed JSON object: compare, tune, plan, deploy) as its typed result. Raises
    :class:`DataError` for anything else, naming what is wrong (and ``source``, the file it came from, when
    given).

    ``strict=False`` reads hand-edited and older documents: missing keys read as absent and another version of
    the format tag is accepted with a warning (see the module's docstring)."""
    try:
        cls, doc, fmt = _tagged(doc)
        version, known = _version(fmt), _version(FORMATS[cls])
        if version != known:
            if version > known or strict:
                raise DataError(f"report format {fmt} is not the {FORMATS[cls]} this calibkit version "
                                f"{'reads' if strict else 'reads (or older)'}",
                                hint="upgrade calibkit to read a newer document" if version > known else
                                "re-run the compare or tune that wrote it, or render it with `calibkit report`")
            log.warning("%sreport format %s is older than %s; reading what this version knows",
                        f"{source}: " if source else "", fmt, FORMATS[cls])
        body = {k: v for k, v in doc.items() if k != "format"}
        return from_json(cls, body, lenient=not strict)
    except DataError as exc:
        if source is None:
            raise
        raise DataError(f"{source}: {exc.message}", hint=exc.hint) from None


def result_type(doc: object) -> type:
    """The result type of a calibkit document (by its format tag); a DataError for anything else."""
    return _tagged(doc)[0]


def _tagged(doc: object) -> tuple[type, dict[str, object], str]:
    """(the result type, the document, its format tag) of a calibkit document; a DataError for anything else."""
    if not isinstance(doc, dict):
        raise DataError(f"a report document must be a JSON object, not {type(doc).__name__}",
                        hint="pass the JSON written by `calibkit compare` or `calibkit tune`")
    fmt = doc.get("format")
    if not isinstance(fmt, str):
        raise DataError("the document has no \"format\" field, so it is not a calibkit report",
                        hint=f"pass the JSON written by `calibkit compare` or `calibkit tune` (format "
                             f"{COMPARE_FORMAT} or {TUNE_FORMAT})")
    cls = KINDS.get(fmt.partition("/")[0])
    if cls is None:
        raise DataError(f"unknown report format {fmt!r}",
                        hint=f"calibkit reads {', '.join(FORMATS.values())} documents")
    return cls, doc, fmt


def _version(fmt: str) -> int:
    """The version number of a format tag ("calibkit-compare/1" -> 1)."""
    text = fmt.partition("/")[2]
    if not (text.isascii() and text.isdigit() and len(text) <= 6):
        raise DataError(f"report format {fmt[:60]!r} has no version number",
                        hint=f"calibkit writes {COMPARE_FORMAT} and {TUNE_FORMAT}")
    return int(text)


def from_json(cls: object, data: object, path: str = "$", *, lenient: bool = False) -> Any:
    """``data`` (plain JSON values) as an instance of the type ``cls`` (a dataclass, tuple, Mapping, enum,
    Optional or scalar annotation). ``lenient``: a missing key reads as absent where its type has an empty
    value (see :func:`parse_result`)."""
    origin = typing.get_origin(cls)
    if cls is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(cls)
        if type(None) in args and (data is None or _non_finite(data)):
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return from_json(arg, data, path, lenient=lenient)
            except DataError as exc:
                errors.append(exc)
        raise errors[0] if errors else _bad(path, "a value", data)
    if origin is tuple:
        args = typing.get_args(cls)
        if not isinstance(data, list):
            raise _bad(path, "a list", data)
        item = args[0] if args else Any
        return tuple(from_json(item, v, f"{path}[{i}]", lenient=lenient) for i, v in enumerate(data))
    if origin in (Mapping, dict, typing.Mapping) or cls in (dict, Mapping):
        args = typing.get_args(cls)
        if not isinstance(data, dict):
            raise _bad(path, "an object", data)
        item = args[1] if len(args) == 2 else Any
        return {str(k): from_json(item, v, f"{path}.{k}", lenient=lenient) for k, v in data.items()}
    if cls is CalibrationTable:
        return _calibration_table(data, path)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        return _dataclass(cls, data, path, lenient)
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        try:
            return cls(data)
        except ValueError:
            raise _bad(path, "one of " + ", ".join(repr(m.value) for m in cls), data) from None
    if cls is bool:
        if not isinstance(data, bool):
            raise _bad(path, "true or false", data)
        return data
    if cls is int:
        if isinstance(data, bool) or not isinstance(data, (int, float)) or _non_finite(data) or int(data) != data:
            raise _bad(path, "an integer", data)
        if abs(data) > MAX_INT:
            raise _bad(path, f"an integer of at most {MAX_INT}", data)
        return int(data)
    if cls is float:  # an integer literal past the largest float (JSON reads 1e400 as inf, 10**400 as an int)
        if isinstance(data, bool) or not isinstance(data, (int, float)) or _non_finite(data) or (
                isinstance(data, int) and abs(data) > sys.float_info.max):
            raise _bad(path, "a finite number", data)
        return float(data)
    if cls is str:
        if not isinstance(data, str):
            raise _bad(path, "a string", data)
        return data
    raise TypeError(f"no JSON mapping for {cls!r} at {path}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _non_finite(data: object) -> bool:
    return isinstance(data, float) and not math.isfinite(data)


def _dataclass(cls: type, data: object, path: str, lenient: bool = False) -> object:
    if not isinstance(data, dict):
        raise _bad(path, "an object", data)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    named = {f.name for f in dataclasses.fields(cls) if not f.metadata.get("flatten")}
    for f in dataclasses.fields(cls):
        if f.metadata.get("json", True) is False or not f.init:
            continue
        if f.metadata.get("flatten"):
            rest = {k: v for k, v in data.items() if k not in named}
            kwargs[f.name] = _flattened(hints[f.name], rest, path, lenient)
            continue
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                kwargs[f.name] = _absent(hints[f.name], f"{path}.{f.name}", lenient)
            continue
        kwargs[f.name] = from_json(hints[f.name], data[f.name], f"{path}.{f.name}", lenient=lenient)
    return cls(**kwargs)


def _flattened(cls: object, rest: dict[str, object], path: str, lenient: bool) -> object:
    """A flattened field read from the keys beside the others (``rest``): a mapping of them all, or a dataclass
    of its own keys; an optional dataclass is None when the document holds none of them."""
    inner = [a for a in typing.get_args(cls) if a is not type(None)]
    if (typing.get_origin(cls) in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls)
            and len(inner) == 1 and dataclasses.is_dataclass(inner[0])
            and not rest.keys() & {f.name for f in dataclasses.fields(inner[0])}):
        return None
    return from_json(cls, rest, path, lenient=lenient)


_EMPTY: dict[Any, Any] = {str: "", int: 0, bool: False}


def _absent(cls: object, path: str, lenient: bool) -> object:
    """The value of a required field a document lacks: its type's empty value when reading leniently, else
    (and for a number or enum, which has none) a :class:`DataError` naming the field."""
    origin = typing.get_origin(cls)
    if lenient:
        if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
            return None
        if origin is tuple:
            return ()
        if origin in (Mapping, dict, typing.Mapping) or cls in (dict, Mapping):
            return {}
        if cls in _EMPTY:
            return _EMPTY[cls]
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            return _dataclass(cls, {}, path, lenient)
    raise DataError(f"the document lacks {path}",
                    hint="pass a document written by this calibkit version's compare or tune" if not lenient else
                    "add the field, or re-run the compare or tune that wrote the document")


def _bad(path: str, wanted: str, data: object) -> DataError:
    shown = json.dumps(data, default=str)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return DataError(f"{path} should be {wanted}, not {shown}",
                     hint="pass a document written by calibkit compare or tune, unedited")


def load_result(path: str | Path, *, strict: bool = True) -> Result:
    """Read a compare or tune JSON file into its typed result (``strict=False``: see :func:`parse_result`);
    what is wrong with it (its size, format version, a type, a value out of its domain) is named with the
    file."""
    return load_typed(path, REPORTS, strict=strict)


def load_typed(path: str | Path, kind: type[T] | tuple[type, ...], *, strict: bool = True) -> T:
    """Read a calibkit JSON file that must hold a ``kind`` document (a type of :data:`FORMATS`, or a tuple of
    them), checked as :func:`load_result` checks reports; another kind of document is a :class:`DataError`
    naming both formats."""
    result: Document = parse_result(_read_document(Path(path)), strict=strict, source=path)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(result, kinds):
        raise DataError(f"{path} is a {FORMATS[type(result)]} document, not "
                        f"{' or '.join(FORMATS[k] for k in kinds)}",
                        hint="pass the file calibkit wrote for this purpose (tune.json or report.json for a "
                             "report, plan.json for a plan, deploy.json for a deployment)")
    check_domains(result, source=path)
    return result  # type: ignore[return-value]


def load_document(path: str | Path, *, strict: bool = False) -> dict[str, Any]:
    """Read a report JSON file and check it as :func:`load_result` does (leniently by default, as ``calibkit
    report`` renders); a missing, unreadable, oversized, malformed or out-of-domain file raises
    :class:`DataError`. Returns the document as read."""
    doc = _read_document(Path(path))
    result: Document = parse_result(doc, strict=strict, source=path)
    if not isinstance(result, REPORTS):
        raise DataError(f"{path} is a {FORMATS[type(result)]} document, not a report",
                        hint="pass the report.json or tune.json of a compare or tune run")
    check_domains(result, source=path)
    return doc


def _read_document(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_DOCUMENT_BYTES:
                raise _too_large(path, size)
            data = fh.read(MAX_DOCUMENT_BYTES + 1)  # a pipe or special file has no size to check up front
    except FileNotFoundError:
        raise DataError(f"{path} does not exist", hint="pass the report.json of a compare or tune run") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a folder", hint="pass the report.json inside it") from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}", hint="pass a readable JSON file") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise _too_large(path, len(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"cannot read {path}: {exc}", hint="pass a UTF-8 JSON file") from None
    try:
        doc = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            hint="re-run the command that wrote it; a truncated file usually means it was copied mid-write",
        ) from None
    except RecursionError:
        raise DataError(f"{path} is JSON nested too deeply to read",
                        hint="pass the JSON written by `calibkit compare` or `calibkit tune`") from None
    except _TooLong as exc:
        raise DataError(f"{path} holds a whole number of {exc.args[0]} digits; a report's numbers have at most "
                        f"{MAX_INT_DIGITS}", hint="pass the JSON written by `calibkit compare` or `calibkit tune`, "
                        "unedited") from None
    result_type(doc)  # validate the kind before anything is written
    return doc


class _TooLong(ValueError):
    pass


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:  # Python's int() of thousands of digits is slow, past 4,300 a ValueError
        raise _TooLong(digits)
    return int(text)


def _too_large(path: Path, size: int) -> DataError:
    return DataError(f"{path} is {size / (1 << 20):.0f} MiB; a report document is at most "
                     f"{MAX_DOCUMENT_BYTES >> 20} MiB", hint="pass the report.json or tune.json calibkit wrote (a "
                     "file this large is not one)")


# ---------------------------------------------------------------- value domains
# By field name: a result's fields are named for what they hold, so one table covers every result type and a
# new field named like its peers is checked with no code here. A Range or Difference takes the domain of the
# field that holds it; a difference between two shares may be negative.

_SHARE = (0.0, 1.0)
_COSINE = (-1.0 - 1e-6, 1.0 + 1e-6)  # float32 vectors: a cosine may round past 1
_NON_NEGATIVE = (0.0, math.inf)
_SIGNED = (-math.inf, math.inf)
# a share is named for one: the name ends with the word once the split it was measured on is taken off
_SHARE_WORDS = re.compile(r"(?:^|_)(accuracy|agreement|flip_rate|f1|precision|recall|fraction|share|confidence|"
                          r"level|overlap_at_k|mcnemar_p)$")
_SPLITS = re.compile(r"(_ci|_search|_holdout)+$")
_BY_NAME: dict[str, tuple[float, float]] = {
    "min_agreement": (0.0, 100.0), "threshold": _SIGNED,
    **dict.fromkeys(("latency_ms", "throughput_per_s", "seconds", "mean_kl", "logit_mse", "max_abs_error",
                     "mean_abs_error", "amax", "fp_absmax", "outlier_ratio", "upper", "texts_median", "max_drop",
                     "max_output_deviation", "tolerance", "text_seconds", "likely_seconds", "worst_seconds",
                     "actual_seconds"), _NON_NEGATIVE),
}


def _domain_of(name: str, inherited: tuple[float, float] | None, signed: bool) -> tuple[float, float] | None:
    if name in _BY_NAME:
        return _BY_NAME[name]
    if signed:  # inside a difference: only its p-value and level are shares
        return _SHARE if name in ("mcnemar_p", "level") else _SIGNED
    if "diff" in name or "delta" in name or name.endswith("minus_fp32"):
        return _SIGNED
    base = _SPLITS.sub("", name)
    if re.search(r"(?:^|_)cosine(?:_mean|_min)?$", base):
        return _COSINE
    if _SHARE_WORDS.search(base):
        return _SHARE
    return inherited


def check_domains(result: Document, *, source: str | Path | None = None) -> None:
    """DataError for a value outside its domain (a share outside [0, 1], a negative count, a cosine past 1),
    naming the file and the field: a hand-edited agreement of 7.5 would render as "flips: -650 %". A field whose
    metadata says ``unchecked`` (tensor dims, where -1 means dynamic) has no domain."""
    try:
        _check(result, "$", None, False)
    except DataError as exc:
        if source is None:
            raise
        raise DataError(f"{source}: {exc.message}", hint=exc.hint) from None


def _check(value: object, path: str, domain: tuple[float, float] | None, signed: bool) -> None:
    from calibkit.results.runs import Difference

    if isinstance(value, bool) or value is None or isinstance(value, (str, enum.Enum)):
        return
    if isinstance(value, int):
        if value < 0:
            raise DataError(f"{path} should be a count or index (>= 0), not {value}",
                            hint="pass a document written by calibkit compare or tune, unedited")
        return
    if isinstance(value, float):
        if domain is not None and not domain[0] <= value <= domain[1]:
            want = {_SHARE: "a share in [0, 1]", _COSINE: "a cosine in [-1, 1]", _NON_NEGATIVE: "at least 0"}.get(
                domain, f"in [{domain[0]:g}, {domain[1]:g}]")
            raise DataError(f"{path} should be {want}, not {value!r}",
                            hint="pass a document written by calibkit compare or tune, unedited")
        return
    if dataclasses.is_dataclass(value):
        inner = signed or isinstance(value, Difference)
        for f in dataclasses.fields(value):
            if f.metadata.get("json", True) is False or f.metadata.get("unchecked"):
                continue
            v, below = getattr(value, f.name), inner or f.name in ("differences", "difference")
            if f.metadata.get("flatten"):
                if v is None or dataclasses.is_dataclass(v):  # its fields are the document's own keys
                    _check(v, path, domain, below)
                    continue
                for k, x in dict(v).items():
                    _check(x, f"{path}.{k}", _domain_of(str(k), domain, below), below)
                continue
            _check(v, f"{path}.{f.name}", _domain_of(f.name, domain, below), below)
        return
    if isinstance(value, Mapping):
        for k, x in value.items():
            _check(x, f"{path}.{k}", domain, signed)
        return
    if isinstance(value, (tuple, list)):
        for i, x in enumerate(value):
            _check(x, f"{path}[{i}]", domain, signed)


# ---------------------------------------------------------------- documents beside the reports
# calibration.json, smoothing.json, engine sidecars, trt_profiles.json, the demo's summary.json and a calibration
# set's manifest.json (results/files.py): the same mapping, their own format tags (the manifest has none, see
# UNTAGGED_DOCUMENTS), read leniently (documents of earlier versions lack newer fields). A CalibrationTable keeps
# its own JSON form (each range with its scale).

CALIBRATION_FORMAT = "calibkit-calibration/1"
DEMO_FORMAT = "calibkit-demo/1"
TRT_PROFILES_FORMAT = "calibkit-trt-profiles/1"
SMOOTHING_FORMAT = "calibkit-smoothing/1"  # also the tag of the record a smoothed model's metadata holds
ENGINE_FORMAT = "calibkit-engine/1"
DOCUMENT_FORMATS: dict[type, str] = {CalibrationDocument: CALIBRATION_FORMAT, DemoSummary: DEMO_FORMAT,
                                     TrtProfiles: TRT_PROFILES_FORMAT, SmoothingRecord: SMOOTHING_FORMAT,
                                     EngineSidecar: ENGINE_FORMAT}
#: documents written without a format tag, by what they are called: a calibration set's manifest.json never
#: carried one (every set sample wrote must still read, and its bytes stay what they were)
UNTAGGED_DOCUMENTS: dict[type, str] = {CalibrationSetManifest: "calibration-set manifest"}
_DOCUMENT_HINT = "pass the file calibkit wrote, unedited, or write it again with the command that made it"


def document_json(document: object) -> dict[str, object]:
    """The JSON document of a typed document value: ``{"format": ..., **fields}`` (its fields alone for an
    untagged document)."""
    if type(document) in UNTAGGED_DOCUMENTS:
        return dict(to_json(document))
    if type(document) not in DOCUMENT_FORMATS:
        raise TypeError(f"{type(document).__name__} has no document format")
    return {"format": DOCUMENT_FORMATS[type(document)], **to_json(document)}


def parse_document(cls: type[_D], doc: object, *, source: str | Path | None = None) -> _D:
    """``doc`` (a parsed JSON object) as the typed document ``cls``. Its format tag must be ``cls``'s (another
    version of it is refused, naming both; an untagged document has none to check); a missing field reads as
    absent, an unknown key is ignored, a mistyped value is refused naming the field (and ``source``, the file it
    came from)."""
    untagged = UNTAGGED_DOCUMENTS.get(cls)
    fmt = DOCUMENT_FORMATS[cls] if untagged is None else ""
    try:
        if not isinstance(doc, dict):
            what = untagged or f"{fmt.partition('/')[0]} document"
            raise DataError(f"a {what} must be a JSON object, not {type(doc).__name__}", hint=_DOCUMENT_HINT)
        if untagged is None and doc.get("format") != fmt:
            raise DataError(f"format {doc.get('format')!r} is not {fmt}, the one this calibkit version reads",
                            hint=_DOCUMENT_HINT)
        parsed: _D = from_json(cls, {k: v for k, v in doc.items() if k != "format"}, lenient=True)
        return parsed
    except DataError as exc:
        if source is None:
            raise
        raise DataError(f"{source}: {exc.message}", hint=exc.hint) from None


def read_smoothing(folder: str | Path) -> SmoothingRecord | None:
    """``folder``'s smoothing.json (a smoothed model folder's record) as its typed record; None when the folder
    holds none. One that is not a record calibkit writes (hand-edited, truncated, another format) raises a
    DataError naming the file and the field."""
    from calibkit._io import read_json
    from calibkit.provenance import SMOOTHING_JSON

    path = Path(folder) / SMOOTHING_JSON
    if not path.is_file():
        return None
    hint = "smooth the model again: `calibkit smooth`"
    try:
        doc = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        raise DataError(f"{path} is not readable JSON ({type(exc).__name__})", hint=hint) from None
    record = parse_document(SmoothingRecord, doc, source=path)
    if len(record.source_sha256) != 64 or not 0 <= record.smoothed <= record.groups:
        raise DataError(f"{path}: its source sha256 or smoothed count is not one calibkit writes", hint=hint)
    return record


def _calibration_table(data: object, path: str) -> CalibrationTable:
    if not isinstance(data, dict):
        raise _bad(path, "an object", data)
    try:
        return CalibrationTable.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"{path} is not a calibration table ({type(exc).__name__}: {exc})",
                        hint=_DOCUMENT_HINT) from None
