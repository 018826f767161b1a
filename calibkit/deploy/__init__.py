"""Serving hand-off: a tuned plan, a calibration or an engine plus the traffic it will serve -> a Triton model
repository (config.pbtxt, the model or the exact TensorRT build, perf_analyzer data, a README).

Deploy consumes results; it evaluates nothing. Modules, each owning one thing:

- ``source``: what SOURCE is (tune folder, calibrate folder, engine) and the build recipe it implies;
- ``traffic``: request texts from a log (the reader and cleanup of ``sample``) and the default log;
- ``modelio``: the served inputs/outputs, dynamic axes required;
- ``profiles``: k length buckets / optimization profiles minimising padded tokens, padding waste;
- ``batching``: preferred batch sizes from a token budget;
- ``triton``: config.pbtxt; ``trtexec``: the build command and trtexec's flag table; ``perfdata``:
  perf_analyzer's input JSON; ``engine``: the same TensorRT build through calibkit's backend;
- ``repository``: the repository written atomically; ``pipeline``: :func:`deploy`.
"""

from __future__ import annotations

from calibkit.deploy.pipeline import DeployOptions, DeployResult, deploy

__all__ = ["DeployOptions", "DeployResult", "deploy"]
