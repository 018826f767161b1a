"""Every file and folder a run reads, found by provenance: the paths it was given and everything their documents
name.

A run given an engine reads its sidecar, and through it the FP32 model (and its folder), the tokenizer folder
and the calibration.json that built it; that calibration.json lives in a calibrate or tune folder and names a
model, a tokenizer and a calibration set, whose manifest names the log it was drawn from; a smoothed model
folder names the model it was smoothed from. :func:`run_inputs` follows those links to the end, so the output
guard (:mod:`calibkit.outdirs`) refuses an output that is, contains or lies inside any of them, whichever
command writes it: `deploy ENGINE --out CALDIR` and `compare --save-outputs MODELFOLDER --force` used to replace
folders no argument named.

Foundation layer: it reads calibkit's documents as plain JSON (their keys are named here once) and imports
nothing else of calibkit. It errs on the side of more inputs: a relative path in a document written before
paths were recorded relative to the document is taken both ways (from the current folder and from the
document's folder).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SIDECAR_SUFFIX = ".calibkit.json"  # ENGINE + this: the engine's sidecar (enginefiles.artifact)
CALIBRATION_JSON = "calibration.json"  # the calibration document of a calibrate or tune folder
MANIFEST_JSON = "manifest.json"  # a calibration set's manifest
SMOOTHING_JSON = "smoothing.json"  # a smoothed model folder's record
OUTPUT_MARKER = ".calibkit-output.json"  # in every folder calibkit writes as a whole (outdirs.MARKER)
PATHS_KEY = "paths"  # in a document: PATHS_RELATIVE when its relative paths are relative to its own folder
PATHS_RELATIVE = "relative to this document's folder"
_MODEL_FOLDER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
_MAX_DOCUMENT = 64 << 20  # larger files are not calibkit's documents: not parsed
_BESIDE = ("the sidecar of", "the model folder of")  # of a file: as direct as the file itself


@dataclass(frozen=True)
class RunInput:
    """One path a run reads: resolved (links followed), and why it is an input: "" when given directly, else
    the chain of documents that leads to it from a given path. ``direct``: given, or the model folder (or the
    sidecar) of a file given — what the user named on the command line."""

    path: Path
    named_by: str = ""
    direct: bool = True


@dataclass(frozen=True)
class RunInputs:
    """Every input of a run, the given paths first."""

    items: tuple[RunInput, ...]

    def __iter__(self) -> Iterator[RunInput]:
        return iter(self.items)

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(i.path for i in self.items)


def resolved(p: str | os.PathLike[str]) -> Path:
    """The absolute path with every symbolic link followed; a link loop stays as it is (never raises)."""
    return Path(os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(p)))))


def run_inputs(given: Iterable[object]) -> RunInputs:
    """The inputs of a run given ``given`` (paths, or values with a ``path`` such as an engine artifact, a
    calibration or eval set, or an ``onnx_path``: a model folder; None and missing paths are skipped), and every
    file and folder their documents name."""
    found: dict[Path, RunInput] = {}
    queue: list[RunInput] = []
    for g in given:
        raw = getattr(g, "path", None) or getattr(g, "onnx_path", None) or g  # artifacts, sets, model folders
        if raw is None or not isinstance(raw, (str, os.PathLike)) or os.fspath(raw) in ("", "-"):
            continue
        item = RunInput(resolved(raw))
        if item.path not in found and os.path.lexists(item.path):
            found[item.path] = item
            queue.append(item)
    while queue:
        item = queue.pop(0)
        for path, why in _named(item.path):
            if path not in found and os.path.lexists(path):
                beside = why.startswith(_BESIDE) and item.direct  # the model folder of a model file given
                found[path] = RunInput(path, f"{why}, {item.named_by}" if item.named_by else why, beside)
                queue.append(found[path])
    return RunInputs(tuple(found.values()))


def document_relative(doc: dict[str, object]) -> bool:
    """Whether a document's relative paths are relative to its own folder (else: written before that rule,
    relative to the folder the run that wrote it ran in)."""
    return doc.get(PATHS_KEY) == PATHS_RELATIVE


def document_path(doc_path: str | os.PathLike[str], value: object,
                  doc: dict[str, object] | None = None) -> Path | None:
    """The one reading of a path a calibkit document holds (calibration.json, an engine sidecar, a manifest,
    smoothing.json, tune.json, plan.json, deploy.json), made absolute: an absolute one as written; a relative
    one against the folder of the document at ``doc_path``, wherever the command runs. ``doc``: the
    document's content, for documents written before that rule (no ``paths`` marker): their relative paths
    were relative to the folder the writing run ran in, so such a path is taken from the current folder when
    only there it names something. None for a missing or empty value."""
    if not isinstance(value, str) or not value:
        return None
    p = Path(value)
    if p.is_absolute():
        return p
    here = Path(os.path.abspath(Path(doc_path).parent / p))
    if doc is not None and not document_relative(doc) and not here.exists() and p.exists():
        return Path(os.path.abspath(p))
    return here


def recorded_paths(doc_path: Path, value: object, *, doc_relative: bool) -> list[Path]:
    """The paths a document's path field may mean: an absolute one as it is; a relative one from the
    document's folder (:func:`document_path`), or (older documents) from the current folder and, to err on the
    safe side, from the document's folder too: what the output guard treats as inputs."""
    named = document_path(doc_path, value)
    if named is None:
        return []
    here = resolved(named)
    if doc_relative or Path(str(value)).is_absolute():
        return [here]
    return list(dict.fromkeys([resolved(str(value)), here]))


def _named(p: Path) -> list[tuple[Path, str]]:
    """What the document at (or of) ``p`` names, each with why it is an input."""
    out: list[tuple[Path, str]] = []
    if p.is_dir():
        for name in (CALIBRATION_JSON, MANIFEST_JSON, SMOOTHING_JSON):
            if (p / name).is_file():
                out.append((resolved(p / name), f"the document of {p}"))
        return out
    if not p.is_file():
        return out
    if p.name.endswith(SIDECAR_SUFFIX):
        doc = _document(p)
        for key in ("source_model", "tokenizer", "calibration_json"):
            for q in recorded_paths(p, doc.get(key), doc_relative=True):  # sidecars always were relative
                out += _with_model_folder(q, key, p)
        return out
    sidecar = p.with_name(p.name + SIDECAR_SUFFIX)
    if sidecar.is_file():
        out.append((resolved(sidecar), f"{_BESIDE[0]} {p}"))
    if p.suffix == ".onnx" and any((p.parent / n).is_file() for n in _MODEL_FOLDER_FILES):
        out.append((p.parent, f"{_BESIDE[1]} {p}"))
    if p.name == CALIBRATION_JSON and (p.parent / OUTPUT_MARKER).is_file():  # a calibrate or tune folder
        out.append((p.parent, f"the folder of {p}"))
    if p.name in (CALIBRATION_JSON, MANIFEST_JSON, SMOOTHING_JSON):
        doc = _document(p)
        rel = document_relative(doc)
        fields: list[tuple[str, object]] = [(k, doc.get(k)) for k in ("source_model", "tokenizer")]
        for key in ("calibration_set", "source"):  # calibration.json's set, a manifest's log
            sub = doc.get(key)
            if isinstance(sub, dict):
                fields.append((key, sub.get("path")))
        for key, value in fields:
            for q in recorded_paths(p, value, doc_relative=rel):
                out += _with_model_folder(q, key, p)
        files = doc.get("files") if p.name == CALIBRATION_JSON else None
        for key, name in files.items() if isinstance(files, dict) else ():
            if isinstance(name, str) and name:
                out.append((resolved(p.parent / name), f"named by {p} (files.{key})"))
    return out


def _with_model_folder(q: Path, key: str, doc: Path) -> list[tuple[Path, str]]:
    why = f"named by {doc} ({key})"
    if key == "source_model":  # a model file is read with its folder (tokenizer, config.json)
        return [(q, why), (q.parent, f"the model folder {why}")]
    return [(q, why)]


def _document(p: Path) -> dict[str, object]:
    try:
        if p.stat().st_size > _MAX_DOCUMENT:
            return {}
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}
