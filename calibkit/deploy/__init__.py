"""Serving hand-off: a tuned plan, a calibration or an engine plus the traffic it will serve -> a Triton model
repository (config.pbtxt, the model or the exact TensorRT build, perf_analyzer data, a README).

Deploy consumes results and measures what it writes: the INT8 layout it ships is the one SOURCE was measured
in unless asked otherwise (with a loud warning), and for ONNX Runtime the model it wrote is measured against
FP32 on the traffic (agreement with its 95 % interval, latency) in the same run. What is asked is
:class:`~calibkit.requests.deploy.DeployRequest` (``calibkit/requests/deploy.py``); the modules here each own one
thing:

- ``source``: what SOURCE is (tune folder, calibrate folder, engine) and the build recipe it implies;
- ``traffic``: request texts from a log (the reader and cleanup of ``sample``) and the default log;
- ``modelio``: the served inputs/outputs, dynamic axes required;
- ``profiles``: k length buckets / optimization profiles minimising padded tokens, padding waste;
- ``batching``: preferred batch sizes from a token budget;
- ``triton``: config.pbtxt; ``trtexec``: the build command and trtexec's flag table; ``perfdata``:
  perf_analyzer's input JSON; ``engine``: the same TensorRT build through calibkit's backend;
- ``measure``: the served model against FP32 on traffic texts; ``readme``: the repository's text files;
- ``repository``: the repository written atomically; ``pipeline``: :func:`deploy`.

The result, :class:`~calibkit.results.documents.DeployResult`, is deploy.json field by field. ``DeployRequest``,
``DeployResult`` and ``deploy`` are imported from here on first use: the request's defaults are read from
``batching``, ``profiles`` and ``triton``, so importing one of those must not import the pipeline (which imports
the request).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DeployRequest", "DeployResult", "deploy"]
_WHERE = {"DeployRequest": "calibkit.requests.deploy", "DeployResult": "calibkit.results.documents",
          "deploy": "calibkit.deploy.pipeline"}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'calibkit.deploy' has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)
