"""A model folder: model.onnx + tokenizer + config.json (as `calibkit demo prepare` and Optimum write)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from calibkit.data.tokenizer import sequence_limit
from calibkit.errors import ModelError


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
    def resolve(cls, model: str | Path, tokenizer: str | Path | None = None) -> ModelDir:
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
                    id2label = {int(k): str(v) for k, v in (data.get("id2label") or {}).items()}
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
