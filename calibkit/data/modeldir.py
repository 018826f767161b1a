"""A model folder: model.onnx + tokenizer + config.json (as `calibkit demo prepare` and Optimum write)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from calibkit._io import read_json
from calibkit.data.tokenizer import sequence_limit
from calibkit.errors import ModelError
from calibkit.types import PathLike

MAX_LABEL_ID = (1 << 31) - 1
_ID_KEY = re.compile(r"[0-9]{1,10}")


def _clip(value: object, n: int = 40) -> str:
    r = repr(value)
    return r if len(r) <= n else r[: n - 1] + "…"


_CONFIGS: dict[tuple[str, int, int], Mapping[str, Any]] = {}  # config.json per file version, parsed once
_PARSED: dict[int, tuple[object, dict[int, str]]] = {}  # id2label objects already parsed (kept alive here)


def read_config(folder: str | Path | None) -> Mapping[str, Any]:
    """A model folder's config.json as a read-only mapping ({} when there is none, or it is not an object),
    parsed once per file version: a run reads it in several places, and a config of a million labels took
    1.5 s per read."""
    if not folder:
        return {}
    p = Path(folder)
    cfg = (p if p.is_dir() else p.parent) / "config.json"
    try:
        st = cfg.stat()
    except OSError:
        return {}
    key = (str(cfg.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _CONFIGS:
        try:
            data = read_json(cfg)  # a FIFO or a device there is an OSError, never waited on
        except (OSError, ValueError, RecursionError) as exc:
            raise ModelError(f"cannot read {cfg}: {type(exc).__name__}: {exc}",
                             hint="config.json must be a JSON object as transformers writes it") from None
        _CONFIGS.clear()  # one or two model folders per run: keep the latest only
        _CONFIGS[key] = MappingProxyType(data) if isinstance(data, dict) else MappingProxyType({})
    return _CONFIGS[key]


def parse_id2label(raw: object, where: str) -> dict[int, str]:
    """config.json's ``id2label`` as {class id: name}: an object whose keys are the ids 0..n-1 (as transformers
    writes them, strings of digits) and whose values are strings. Anything else is a ModelError naming the
    first offending entry (values shown clipped, so a hostile config cannot flood the terminal); absent or
    null is {}. ``where``: the file, for the message."""
    hint = ('write id2label as transformers does, an object from class id to name: {"0": "negative", '
            '"1": "positive"}')
    if raw is None:
        return {}
    done = _PARSED.get(id(raw))
    if done is not None and done[0] is raw:
        return dict(done[1])
    if not isinstance(raw, Mapping):
        raise ModelError(f"{where}: id2label is a {type(raw).__name__}, not an object of class id -> name",
                         hint=hint)
    out: dict[int, str] = {}
    for k, v in raw.items():
        key = k if isinstance(k, int) and not isinstance(k, bool) else None
        if isinstance(k, str) and _ID_KEY.fullmatch(k):
            key = int(k)
        if key is None or not 0 <= key <= MAX_LABEL_ID:
            raise ModelError(f"{where}: id2label key {_clip(k)} is not a class id (a non-negative integer)", hint=hint)
        if not isinstance(v, str):
            raise ModelError(f"{where}: id2label[{key}] is {_clip(v)}, not a label name (a string)", hint=hint)
        out[key] = v
    if out and max(out) != len(out) - 1:
        missing = next(i for i in range(len(out)) if i not in out)
        raise ModelError(f"{where}: id2label names {len(out)} classes but not class {missing} (ids must be "
                         f"0..{len(out) - 1}, one per output of the classifier)", hint=hint)
    if len(_PARSED) > 8:
        _PARSED.clear()
    _PARSED[id(raw)] = (raw, out)
    return dict(out)


@dataclass(frozen=True)
class ModelDir:
    onnx_path: Path
    tokenizer_path: Path
    id2label: dict[int, str] = field(default_factory=dict)
    max_length: int = 512  # tokens: see data.tokenizer.sequence_limit
    max_length_source: str = "default"

    @property
    def label2id(self) -> dict[str, int]:
        return {v: k for k, v in self.id2label.items()}

    @classmethod
    def resolve(cls, model: PathLike, tokenizer: PathLike | None = None) -> ModelDir:
        """Accept a folder holding model.onnx, or an .onnx file plus a tokenizer folder."""
        p = Path(model)
        if p.is_dir():
            candidates = [p / "model.onnx", *sorted(p.glob("*.onnx"))]
            onnx_path = next((c for c in candidates if c.is_file()), None)
            if onnx_path is None:
                raise ModelError(f"no .onnx file in {p}", hint="pass a folder with model.onnx or an .onnx file")
            folder = p
        elif p.is_file() and p.suffix == ".onnx":
            onnx_path = p
            folder = p.parent
        else:
            raise ModelError(
                f"model not found: {p}",
                hint="pass a model folder (model.onnx + tokenizer + config.json) or an .onnx file with --tokenizer",
            )
        tok = Path(tokenizer) if tokenizer else folder
        if not ((tok / "tokenizer.json").is_file() or (tok / "vocab.txt").is_file() or tok.is_file()):
            raise ModelError(
                f"no tokenizer found for {onnx_path.name} (looked in {tok})",
                hint="pass --tokenizer with the model's Hugging Face folder",
            )
        id2label: dict[int, str] = {}
        config_dir: Path | None = None
        for cfg_dir in (folder, tok if tok.is_dir() else tok.parent):
            cfg = cfg_dir / "config.json"
            if cfg.is_file():
                try:
                    data = json.loads(cfg.read_text(encoding="utf-8"))
                    if not isinstance(data, dict):
                        raise ValueError("not a JSON object")
                    id2label = parse_id2label(data.get("id2label"), str(cfg))
                    mpe = data.get("max_position_embeddings")
                    if mpe is not None and (not isinstance(mpe, int) or isinstance(mpe, bool) or mpe < 1):
                        raise ValueError(f"max_position_embeddings is {mpe!r}, not a positive integer")
                except (OSError, ValueError, TypeError, AttributeError, RecursionError) as exc:
                    raise ModelError(f"cannot read {cfg}: {type(exc).__name__}: {exc}",
                                     hint="config.json must be a JSON object as transformers writes it "
                                     "(id2label, max_position_embeddings)") from None
                config_dir = cfg_dir
                break
        limit = sequence_limit(tok, config_dir)
        return cls(onnx_path=onnx_path, tokenizer_path=tok, id2label=id2label, max_length=limit.tokens,
                   max_length_source=limit.source)
