"""How :class:`SensitivityJob` work units travel to workers.

A job names files (the FP32 model, the calibration table, the tokenizer folder) and carries its eval rows
inline; neither survives a trip to another machine cheaply. :func:`pack_jobs` shares every distinct file and
every distinct (texts, labels, reference logits) block once through the executor and turns each job into a
:class:`ShippedJob` of references and a few numbers; :func:`run_shipped_job`, on the worker, materializes the
references into local files (once per process) and runs the unchanged
:func:`calibkit.evaluate.sensitivity.run_sensitivity_job`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from calibkit.errors import ModelError
from calibkit.executors.base import Executor, Shared, fetch, materialize

if TYPE_CHECKING:  # sensitivity imports this module
    from calibkit.evaluate.jobs import SensitivityJob, SensitivityResult

# what a tokenizer folder needs; model weights beside it (the folder is often the model folder) stay home
_WEIGHT_SUFFIXES = {".onnx", ".bin", ".safetensors", ".pt", ".pth", ".h5", ".msgpack", ".ot", ".data", ".npz"}
_MAX_TOKENIZER_FILE = 64 << 20


@dataclass(frozen=True)
class ShippedJob:
    """A SensitivityJob whose files and eval rows are :class:`Shared` references."""

    model: Shared[bytes]  # the FP32 ONNX model
    table: Shared[bytes]  # the calibration JSON
    tokenizer: Shared[dict[str, bytes]]  # {file name: bytes} of the tokenizer folder
    tokenizer_file: str | None  # the tokenizer was this file of the folder (None: the folder itself)
    data: Shared  # (texts, labels, reference_logits, neighbour_index, index_rows)
    keep_nodes: tuple[str, ...]
    mode: str
    node: str | None
    target: str
    batch_size: int
    threads: int
    max_length: int | None
    output_name: str | None = None
    task: str = "classification"
    pooling: str | None = None


def tokenizer_files(path: Path) -> tuple[dict[str, bytes], str | None]:
    if path.is_file():
        return {path.name: path.read_bytes()}, path.name
    if not path.is_dir():
        raise ModelError(f"tokenizer not found: {path}")
    files = {
        p.name: p.read_bytes()
        for p in sorted(path.iterdir())
        if p.is_file() and p.suffix not in _WEIGHT_SUFFIXES and p.stat().st_size <= _MAX_TOKENIZER_FILE
    }
    return files, None


def _share_model(path: str, executor: Executor) -> Shared:
    """The model's file, or, when its weights live in external-data files beside it (which a worker's copy
    would not find), the model with its weights inlined."""
    from calibkit.graph import load_model

    st = os.stat(path)
    if not _uses_external_data(str(Path(path).resolve()), st.st_size, st.st_mtime_ns):
        return executor.share_file(path)
    return executor.share(load_model(path, load_external_data=True).SerializeToString())


@functools.lru_cache(maxsize=16)
def _uses_external_data(path: str, size: int, mtime_ns: int) -> bool:
    """Parsed once per file version: tune packs jobs for every batch of candidates, and a 1.3 GB model with
    inline weights would otherwise be parsed each time only to learn it has no external data."""
    from onnx.external_data_helper import uses_external_data

    from calibkit.graph import load_model

    return any(uses_external_data(t) for t in load_model(path, load_external_data=False).graph.initializer)


def pack_jobs(jobs: Sequence[SensitivityJob], executor: Executor, threads: int | None = None) -> list[ShippedJob]:
    """Share what ``jobs`` need once and return their light shipped form.

    ``threads``: intra-op threads per job (default: each job's own)."""
    tokenizers: dict[str, tuple[Shared, str | None]] = {}
    blocks: dict[tuple[int, ...], Shared] = {}
    models: dict[str, Shared] = {}
    out = []
    for j in jobs:
        if j.source_model not in models:
            models[j.source_model] = _share_model(j.source_model, executor)
        tok = tokenizers.get(j.tokenizer)
        if tok is None:
            files, single = tokenizer_files(Path(j.tokenizer))
            tok = tokenizers[j.tokenizer] = (executor.share(files), single)
        ident = (id(j.texts), id(j.labels), id(j.reference_logits), id(j.neighbour_index), id(j.index_rows))
        data = blocks.get(ident)
        if data is None:
            data = blocks[ident] = executor.share((j.texts, j.labels, j.reference_logits, j.neighbour_index,
                                                   j.index_rows))
        table = Path(j.calibration_json)
        out.append(ShippedJob(
            model=models[j.source_model],
            table=executor.share_file(table / "calibration.json" if table.is_dir() else table),
            tokenizer=tok[0], tokenizer_file=tok[1], data=data, keep_nodes=tuple(j.keep_nodes), mode=j.mode,
            node=j.node, target=j.target, batch_size=j.batch_size, threads=threads or j.threads,
            max_length=j.max_length, output_name=j.output_name, task=j.task, pooling=j.pooling,
        ))
    return out


def unpack_job(s: ShippedJob) -> SensitivityJob:
    """The SensitivityJob ``s`` stands for, with local paths (on the worker)."""
    from calibkit.evaluate.jobs import SensitivityJob

    texts, labels, ref, index, index_rows = fetch(s.data)
    tok = materialize(s.tokenizer)
    return SensitivityJob(
        source_model=str(materialize(s.model)), calibration_json=str(materialize(s.table)),
        tokenizer=str(tok / s.tokenizer_file if s.tokenizer_file else tok), texts=texts, labels=labels,
        reference_logits=ref, keep_nodes=s.keep_nodes, mode=s.mode, node=s.node, target=s.target,
        batch_size=s.batch_size, threads=s.threads, max_length=s.max_length, output_name=s.output_name,
        task=s.task, pooling=s.pooling, neighbour_index=index, index_rows=index_rows,
    )


def run_shipped_job(s: ShippedJob) -> SensitivityResult:
    """The work unit executors run: :func:`run_sensitivity_job` on the unpacked job."""
    from calibkit.evaluate.jobs import run_sensitivity_job

    return run_sensitivity_job(unpack_job(s))
