"""Writing the Triton model repository as a whole: built under a temporary name, swapped in when complete.

Layout::

    OUT/
      README.md             how to start the server, what was chosen and why
      deploy.json           every choice, the numbers behind it and the served model measured (calibkit-deploy/2)
      perf_data.json        perf_analyzer --input-data: real traffic texts, tokenized and bucket-padded
      perf_analyzer.sh      the load test that replays them
      NAME/
        config.pbtxt
        labels.txt          when the model has label names
        1/model.onnx        ONNX Runtime (+ its calibkit sidecar)
        1/                  TensorRT: model.plan is built on the serving GPU by build_engine.sh
        model.<precision>.onnx, build_engine.sh, trt_profiles.json   (TensorRT)

Nothing in OUT carries this machine's absolute paths: deploy.json, the README and the engine sidecar name what
deploy read relative to the folder they are in (:func:`shipped_result`, :func:`ship_sidecar`), so the repository
can be copied to the serving machine as it is.

OUT follows the rules of every folder calibkit writes (:mod:`calibkit.outdirs`): the marker file listing every
file written, never an input, an existing folder replaced only where calibkit wrote every file in it (a file it
did not write is never deleted, moved or overwritten, ``--force`` or not), one writer at a time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibkit._io import atomic_dir, dumps_json, final_path, read_json, write_json
from calibkit.errors import UsageError
from calibkit.outdirs import check_not_input, check_replaceable
from calibkit.provenance import RunInputs
from calibkit.results.documents import DeployResult

# OUT's own files: a model named like one of them would collide with it (compared without case: macOS and
# Windows file systems do not tell README.md from readme.md)
REPOSITORY_FILES = ("README.md", "deploy.json", "perf_data.json", "perf_analyzer.sh")


def check_model_name(name: str, option: str = "--name") -> None:
    """Refuse a model name that is one of OUT's own files (``--name README.md``), before any work."""
    if name.casefold() in {f.casefold() for f in REPOSITORY_FILES}:
        raise UsageError(f"{option} {name!r} is the name of one of the repository's own files "
                         f"({', '.join(REPOSITORY_FILES)}); the model folder would collide with it",
                         hint="pass another --name, e.g. the model's name and precision")


def guard_repository(out: Path, inputs: Sequence[Path | None] | RunInputs) -> None:
    """Before any work: OUT is none of the run's inputs (by provenance) and may be replaced."""
    check_not_input(out, inputs)
    check_replaceable(out)


@dataclass(frozen=True)
class RepositoryFiles:
    """Text files to write, by path relative to OUT; executables by path."""

    texts: Mapping[str, str]
    executables: tuple[str, ...] = ()
    json_docs: Mapping[str, object] | None = None  # stable, indented JSON
    compact_docs: Mapping[str, object] | None = None  # one-line JSON (large data files)


def write_repository(out: Path, name: str, build_models: Callable[[Path], RepositoryFiles], *,
                     inputs: Sequence[Path | None] | RunInputs = ()) -> Path:
    """Write OUT atomically: ``build_models(model_folder)`` writes the model files into ``NAME/`` of the
    temporary folder (and may measure them there) and returns the other files, which are then added. Returns
    OUT."""
    check_model_name(name)
    check_not_input(out, inputs)
    # no legacy names: deploy is younger than the marker file, so an unmarked folder is never one it wrote
    with atomic_dir(out, what="deploy") as tmp:
        model_dir = tmp / name
        (model_dir / "1").mkdir(parents=True)
        files = build_models(model_dir)
        for rel, obj in (files.json_docs or {}).items():
            (tmp / rel).write_text(dumps_json(obj), encoding="utf-8")
        for rel, obj in (files.compact_docs or {}).items():
            (tmp / rel).write_text(json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n",
                                   encoding="utf-8")
        for rel, text in files.texts.items():
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        for rel in files.executables:
            p = tmp / rel
            mode = p.stat().st_mode
            os.chmod(p, mode | ((stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH) & ~_umask() & 0o777))
    return out


def _umask() -> int:
    from calibkit.outdirs import umask

    return umask()


def relative_to(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> str:
    """``path`` as the files in ``folder`` name it: relative to ``folder`` (links followed on both sides), or
    its name alone where no relative path exists (another drive)."""
    home = os.path.realpath(os.path.abspath(folder))
    try:
        return os.path.relpath(os.path.realpath(os.path.abspath(path)), home)
    except ValueError:
        return Path(path).name


def _relative_text(text: str, pairs: Sequence[tuple[str, str]]) -> str:
    for absolute, rel in pairs:
        text = text.replace(absolute, rel)
    return text


def shipped_result(result: DeployResult, out: str | os.PathLike[str]) -> DeployResult:
    """``result`` as the repository's files state it: SOURCE's and the traffic's paths relative to OUT (read
    back by :func:`calibkit.provenance.document_path` against deploy.json's folder), and the same paths in the
    warnings and the measurement note; the result deploy returns keeps them absolute."""
    src, tr = result.source, result.traffic
    fields = ("path", "model", "tokenizer", "calibration_json", "qdq_model", "calibration_set")
    # str values for str path fields: Any because replace(**rel) is checked against every field's type
    rel: dict[str, Any] = {f: relative_to(getattr(src, f), out) for f in fields if getattr(src, f)}
    pairs = sorted({(os.path.abspath(v), relative_to(v, out)) for v in
                    [tr.path, *(getattr(src, f) for f in fields)] if v}, key=lambda p: -len(p[0]))
    return dataclasses.replace(
        result, source=dataclasses.replace(src, **rel),
        traffic=dataclasses.replace(tr, path=relative_to(tr.path, out)),
        warnings=tuple(_relative_text(w, pairs) for w in result.warnings),
        measurement_note=_relative_text(result.measurement_note, pairs) if result.measurement_note else None)


def ship_sidecar(sidecar: Path) -> None:
    """Rewrite the engine sidecar deploy's build wrote into the repository with its paths relative to the
    folder it will be in (sidecars are read that way, :class:`calibkit.enginefiles.artifact.EngineArtifact`),
    not this machine's absolute paths."""
    if not sidecar.is_file():
        return
    from calibkit.results.codec import document_json, parse_document
    from calibkit.results.files import EngineSidecar

    doc = parse_document(EngineSidecar, read_json(sidecar), source=sidecar)
    home = final_path(sidecar).parent

    def rel(v: str | None) -> str | None:
        return relative_to(v, home) if v is not None and os.path.isabs(v) else v

    extra = doc.extra
    write_json(sidecar, document_json(dataclasses.replace(
        doc, source_model=rel(doc.source_model), tokenizer=rel(doc.tokenizer),
        calibration_json=rel(doc.calibration_json),
        extra=dataclasses.replace(extra, qdq_source=rel(extra.qdq_source)))))
