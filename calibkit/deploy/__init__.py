"""Serving hand-off: a tuned plan, a calibration or an engine plus the traffic it will serve -> a Triton model
repository (config.pbtxt, the model or the exact TensorRT build, perf_analyzer data, a README).

Deploy consumes results and measures what it writes: the INT8 layout it ships is the one SOURCE was measured
in unless asked otherwise (with a loud warning), and for ONNX Runtime the model it wrote is measured against
FP32 on the traffic (agreement with its 95 % interval, latency) in the same run. Modules, each owning one thing:

- ``request``: :class:`DeployRequest`, what is asked, its defaults and checks;
- ``source``: what SOURCE is (tune folder, calibrate folder, engine) and the build recipe it implies;
- ``traffic``: request texts from a log (the reader and cleanup of ``sample``) and the default log;
- ``modelio``: the served inputs/outputs, dynamic axes required;
- ``profiles``: k length buckets / optimization profiles minimising padded tokens, padding waste;
- ``batching``: preferred batch sizes from a token budget;
- ``triton``: config.pbtxt; ``trtexec``: the build command and trtexec's flag table; ``perfdata``:
  perf_analyzer's input JSON; ``engine``: the same TensorRT build through calibkit's backend;
- ``measure``: the served model against FP32 on traffic texts; ``readme``: the repository's text files;
- ``repository``: the repository written atomically; ``pipeline``: :func:`deploy`.

The result, :class:`~calibkit.results.documents.DeployResult`, is deploy.json field by field.
"""

from __future__ import annotations

from calibkit.deploy.pipeline import DeployResult, deploy
from calibkit.deploy.request import DeployRequest

__all__ = ["DeployRequest", "DeployResult", "deploy"]
