"""The TensorRT build of a deployed model through calibkit's own TensorRT backend (the alternative to trtexec).

``python -m calibkit.deploy.engine OUT/NAME`` reads ``NAME/trt_profiles.json`` (written by ``calibkit deploy``)
and builds ``NAME/1/model.plan`` from the Q/DQ ONNX beside it with every optimization profile, strongly typed,
with the timing cache and layer JSON that ``trtexec`` in ``build_engine.sh`` writes to the same paths.
Run it on the serving GPU, with the TensorRT version of the Triton container (``pip install
'calibkit[tensorrt]'`` there).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibkit._io import read_json
from calibkit.errors import CalibkitError, UsageError

PROFILES_FILE = "trt_profiles.json"
PLAN = "1/model.plan"


@dataclass(frozen=True)
class PlanSpec:
    onnx: str
    plan: str
    workspace_mib: int
    profiles: tuple[dict[str, int], ...]  # SeqProfile.to_dict() of each profile

    def to_dict(self) -> dict[str, Any]:
        return {"format": "calibkit-trt-profiles/1", "onnx": self.onnx, "plan": self.plan,
                "workspace_mib": self.workspace_mib, "profiles": [dict(p) for p in self.profiles]}


def read_spec(folder: Path) -> PlanSpec:
    p = folder / PROFILES_FILE
    try:
        d = read_json(p)
        if d.get("format") != "calibkit-trt-profiles/1":
            raise ValueError("not a calibkit-trt-profiles/1 document")
        return PlanSpec(str(d["onnx"]), str(d["plan"]), int(d["workspace_mib"]),
                        tuple({str(k): int(v) for k, v in x.items()} for x in d["profiles"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{p} cannot be read ({exc})",
                         hint="pass the model folder inside a repository written by `calibkit deploy`") from None


def build_plan(folder: str | Path) -> Path:
    """Build ``folder/1/model.plan`` as ``folder/build_engine.sh`` does with trtexec; returns its path."""
    from calibkit.engines.tensorrt.builder import build_engine
    from calibkit.engines.tensorrt.profile import SeqProfile
    from calibkit.provenance import document_path

    f = Path(folder)
    spec = read_spec(f)
    profiles = [SeqProfile(**p) for p in spec.profiles]
    onnx, plan = (document_path(f / PROFILES_FILE, v) or f / v for v in (spec.onnx, spec.plan))
    res = build_engine(onnx.read_bytes(), plan, profiles, workspace_bytes=spec.workspace_mib << 20)
    return res.engine


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m calibkit.deploy.engine OUT/NAME", file=sys.stderr)
        return 2
    try:
        plan = build_plan(args[0])
    except CalibkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"wrote {plan}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
