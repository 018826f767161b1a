"""Engine artifacts and their metadata sidecar, so `compare` knows what a file holds.

An ONNX Runtime engine is ``NAME.onnx`` with ``NAME.onnx.calibkit.json`` beside it; a TensorRT engine is
``NAME.engine`` with ``NAME.engine.calibkit.json``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibkit._io import read_json, write_json
from calibkit.errors import DataError, ModelError
from calibkit.provenance import SIDECAR_SUFFIX, document_path
from calibkit.results.codec import document_json, parse_document
from calibkit.results.files import EngineBuildFacts, EngineSidecar
from calibkit.types import Backend, PathLike, Precision


def sidecar_path(engine: PathLike) -> Path:
    p = Path(engine)
    return p.with_name(p.name + SIDECAR_SUFFIX)


_EDGE = 1 << 20


def _no_sidecar_hint(p: Path) -> str:
    """What to run for an engine file without a sidecar; for the Q/DQ model `calibrate` or `tune` wrote (named
    in the calibration.json beside it), the exact `calibkit build --qdq` command that makes an engine of it."""
    generic = "build engines with `calibkit build`, which writes the sidecar beside the engine"
    try:
        doc = read_json(p.parent / "calibration.json")
    except (OSError, ValueError, RecursionError):
        return generic
    if not isinstance(doc, dict):
        return generic
    files = doc.get("files")
    source = document_path(p.parent / "calibration.json", doc.get("source_model"), doc)
    tok = document_path(p.parent / "calibration.json", doc.get("tokenizer"), doc)
    if not isinstance(files, dict) or files.get("model") != p.name or source is None:
        return generic
    model = source
    # a model folder carries its tokenizer; an .onnx file elsewhere needs --tokenizer
    args = str(model.parent) if tok == model.parent else (f"{model}" + (f" --tokenizer {tok}" if tok else ""))
    engine = Path("engines") / f"{p.parent.name or 'int8'}.int8.onnx"
    return (f"{p} is the Q/DQ model `calibkit calibrate` (or `tune`) writes, not an engine: build one from it, "
            f"then compare that: calibkit build {args} --precision int8 --qdq {p} -o {engine}")


def fingerprint(engine: Path) -> str:
    """Size and the sha256 of the first and last MiB: cheap on a 1.3 GB engine, and it tells one build from
    another (an FP32 file from the INT8 one an interrupted rebuild left under its sidecar), copies alike. An ONNX
    engine whose weights are external data files adds each file's name, size and edges, so a weights file edited
    beside an unchanged .onnx is another engine (one without external data keeps the fingerprint it had)."""
    from calibkit.consistency import external_data_names

    size = engine.stat().st_size
    h = hashlib.sha256(str(size).encode())
    _edges(h, engine, size)
    if engine.suffix == ".onnx":
        for name in sorted(external_data_names(engine)):
            part = engine.parent / name
            h.update(b"\0" + name.encode("utf-8", "surrogateescape") + b"\0")
            if part.is_file():
                n = part.stat().st_size
                h.update(str(n).encode())
                _edges(h, part, n)
    return f"{size}:{h.hexdigest()[:32]}"


def _edges(h: hashlib._Hash, path: Path, size: int) -> None:
    with open(path, "rb") as fh:
        h.update(fh.read(_EDGE))
        if size > 2 * _EDGE:
            fh.seek(size - _EDGE)
        h.update(fh.read(_EDGE))


@dataclass(frozen=True)
class EngineArtifact:
    path: Path
    precision: Precision
    backend: Backend | str  # a built-in backend, or the name another one is registered under
    source_model_sha256: str
    calibration_sha256: str | None = None
    tokenizer: str | None = None  # folder of the tokenizer and config.json
    kept_higher_precision: tuple[str, ...] = ()  # node names left out of INT8/FP16
    source_model: str | None = None  # the FP32 ONNX this engine was built from (for sensitivity re-builds)
    calibration_json: str | None = None  # the calibration.json whose table built an INT8 engine
    tokenizer_sha256: str | None = None  # consistency.tokenizer_sha256 of the tokenizer folder at build time
    labels_sha256: str | None = None  # consistency.labels_sha256 of its config.json id2label at build time
    versions: dict[str, str] = field(default_factory=dict)
    extra: EngineBuildFacts = EngineBuildFacts()

    @property
    def backend_name(self) -> str:
        return self.backend.value if isinstance(self.backend, Backend) else str(self.backend)

    def sidecar(self, engine_fingerprint: str | None = None) -> EngineSidecar:
        """The sidecar document of this engine (paths as this value holds them)."""
        return EngineSidecar(
            path=self.path.name, precision=self.precision, backend=self.backend_name,
            source_model_sha256=self.source_model_sha256, calibration_sha256=self.calibration_sha256,
            tokenizer=self.tokenizer, kept_higher_precision=self.kept_higher_precision,
            source_model=self.source_model, calibration_json=self.calibration_json,
            tokenizer_sha256=self.tokenizer_sha256, labels_sha256=self.labels_sha256, versions=dict(self.versions),
            extra=self.extra, engine_fingerprint=engine_fingerprint)

    def to_dict(self) -> dict[str, Any]:
        """The sidecar's JSON, without the fingerprint of the file (:meth:`save` adds it)."""
        doc = document_json(self.sidecar())
        del doc["engine_fingerprint"]
        return doc

    def save(self) -> Path:
        """Write the sidecar of the engine file as it is now on disk (its fingerprint included)."""
        out = sidecar_path(self.path)
        write_json(out, document_json(self.sidecar(fingerprint(self.path))))
        return out

    @classmethod
    def load(cls, engine: PathLike) -> EngineArtifact:
        p = Path(engine)
        if not p.is_file():
            raise ModelError(f"engine not found: {p}")
        sc = sidecar_path(p)
        if not sc.is_file():
            raise ModelError(f"{p} has no calibkit sidecar ({sc.name})", hint=_no_sidecar_hint(p))
        hint = "rebuild the engine with `calibkit build`, which writes the sidecar again"
        try:
            doc = parse_document(EngineSidecar, read_json(sc), source=sc)
        except (ValueError, RecursionError) as exc:
            raise ModelError(f"{sc} is not valid JSON ({type(exc).__name__})", hint=hint) from None
        except DataError as exc:
            raise ModelError(f"{exc.message} (not a usable calibkit sidecar)", hint=hint) from None
        if not doc.backend or not doc.source_model_sha256:
            raise ModelError(f"{sc} is not a usable calibkit sidecar (it names no backend or source model)",
                             hint=hint)
        if doc.engine_fingerprint is not None and doc.engine_fingerprint != fingerprint(p):
            raise ModelError(
                f"{sc.name} describes another file than {p} (an interrupted rebuild, or an engine copied over "
                "another one without its sidecar)",
                hint="rebuild the engine with `calibkit build ... -o " + str(p) + "`, which writes both again",
            )

        def _abs(v: str | None) -> str | None:  # a sidecar's paths were always relative to its folder
            named = document_path(sc, v)
            return str(named.resolve()) if named is not None and not Path(v or "").is_absolute() else v

        return cls(path=p, precision=doc.precision, backend=_backend(doc.backend),
                   source_model_sha256=doc.source_model_sha256, calibration_sha256=doc.calibration_sha256,
                   tokenizer=_abs(doc.tokenizer), kept_higher_precision=doc.kept_higher_precision,
                   source_model=_abs(doc.source_model), calibration_json=_abs(doc.calibration_json),
                   tokenizer_sha256=doc.tokenizer_sha256, labels_sha256=doc.labels_sha256,
                   versions=dict(doc.versions), extra=doc.extra)


def _backend(v: object) -> Backend | str:
    """A built-in backend's enum member, else the name (the registry refuses one nobody registered)."""
    if not isinstance(v, str) or not v:
        raise ValueError(f"backend must be a name, got {v!r}")
    return Backend(v) if v in {b.value for b in Backend} else v
