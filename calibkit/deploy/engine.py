"""The TensorRT build of a deployed model through calibkit's own TensorRT backend (the alternative to trtexec).

``python -m calibkit.deploy.engine OUT/NAME`` reads ``NAME/trt_profiles.json`` (written by ``calibkit deploy``)
and builds ``NAME/1/model.plan`` from the Q/DQ ONNX beside it with every optimization profile, strongly typed,
with the timing cache and layer JSON that ``trtexec`` in ``build_engine.sh`` writes to the same paths.
Run it on the serving GPU, with the TensorRT version of the Triton container (``pip install
'calibkit[tensorrt]'`` there).
"""

from __future__ import annotations

import sys
from pathlib import Path

from calibkit._io import read_json
from calibkit.errors import CalibkitError, DataError, UsageError
from calibkit.results.files import TrtProfiles

PROFILES_FILE = "trt_profiles.json"
PLAN = "1/model.plan"


def read_spec(folder: Path) -> TrtProfiles:
    """``folder/trt_profiles.json`` through the codec; a UsageError when it cannot be read."""
    from calibkit.results.codec import parse_document

    p = folder / PROFILES_FILE
    try:
        spec = parse_document(TrtProfiles, read_json(p), source=p)
        if not spec.onnx or not spec.plan or not spec.profiles:
            raise ValueError("it names no ONNX, plan or profile")
        return spec
    except (OSError, ValueError, RecursionError, DataError) as exc:
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
