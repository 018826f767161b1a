"""``calibkit export``: a user's model to the model folder calibkit reads (model.onnx + tokenizer + config.json).

:mod:`calibkit.exporter.pipeline` decides what the source is, which task it serves and whether the export
matches it; :mod:`calibkit.exporter.torch_export` (the only part that imports torch) loads and exports the
checkpoint.
"""

from calibkit.exporter.pipeline import ExportResult, ExportSource, Parity, SourceKind, export_model, resolve_source

__all__ = ["ExportResult", "ExportSource", "Parity", "SourceKind", "export_model", "resolve_source"]
