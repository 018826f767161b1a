"""The typed results are the one contract: every field round-trips through its JSON document, and the public API
returns them."""

from __future__ import annotations

import dataclasses
import enum
import json
import random
import subprocess
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path

import pytest

from calibkit.errors import DataError
from calibkit.results import documents as D
from calibkit.results import runs as R
from calibkit.results.codec import (
    COMPARE_FORMAT,
    DEPLOY_FORMAT,
    PLAN_FORMAT,
    TUNE_FORMAT,
    parse_result,
    to_document,
    to_json,
)

ROOT = Path(__file__).resolve().parents[1]


def _random(tp: typing.Any, rng: random.Random, depth: int = 0) -> typing.Any:
    """A random value of the annotation ``tp``: every optional field is sometimes None, sometimes set."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if type(None) in typing.get_args(tp) and rng.random() < 0.3:
            return None
        return _random(rng.choice(args), rng, depth)
    if origin is tuple:
        n = rng.randint(0, 3 if depth < 3 else 1)
        return tuple(_random(typing.get_args(tp)[0], rng, depth + 1) for _ in range(n))
    if origin in (Mapping, dict) or tp in (dict, Mapping):
        key_tp, val_tp = typing.get_args(tp)
        return {f"k{i}_{rng.randint(0, 99)}": _random(val_tp, rng, depth + 1) for i in range(rng.randint(0, 3))}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.metadata.get("json", True) is False or not f.init:
                continue
            if f.metadata.get("flatten"):  # its keys must not collide with the named fields
                val_tp = typing.get_args(hints[f.name])[1]
                kwargs[f.name] = {f"x_{i}": _random(val_tp, rng, depth + 1) for i in range(rng.randint(0, 3))}
                continue
            kwargs[f.name] = _random(hints[f.name], rng, depth + 1)
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return rng.choice(list(tp))
    if tp is bool:
        return rng.random() < 0.5
    if tp is int:
        return rng.randint(-5, 10_000)
    if tp is float:
        return rng.choice([0.0, 1.0, -2.5, rng.uniform(-1e6, 1e6), rng.random(), 1e-300])
    if tp is str:
        return rng.choice(["", "a", "fc1", "bert.encoder.layer.4 (MatMul_12)", "ünïcode [x]", "line\nbreak"])
    raise TypeError(tp)


@pytest.mark.parametrize("cls", [R.Comparison, R.TuneResult, D.PlanDocument, D.DeployResult])
@pytest.mark.parametrize("seed", range(40))
def test_every_field_round_trips_through_the_json_document(cls: type, seed: int) -> None:
    result = _random(cls, random.Random(seed))
    doc = to_document(result)
    assert doc["format"] == {R.Comparison: COMPARE_FORMAT, R.TuneResult: TUNE_FORMAT, D.PlanDocument: PLAN_FORMAT,
                             D.DeployResult: DEPLOY_FORMAT}[cls]
    text = json.dumps(doc, allow_nan=False, sort_keys=True)
    assert parse_result(json.loads(text)) == result


def test_every_result_field_is_in_the_document() -> None:
    """Each dataclass field of a result maps to a key (or, flattened, to keys) of its JSON object."""
    result = _random(R.Comparison, random.Random(3))
    doc = to_json(result)
    for f in dataclasses.fields(R.Comparison):
        assert (f.name in doc) == (f.metadata.get("json", True) is not False), f.name


def test_a_mistyped_document_is_refused_with_its_path() -> None:
    doc = to_document(_random(R.TuneResult, random.Random(1)))
    doc["final"]["kept_nodes"] = "fc1"
    with pytest.raises(DataError, match=r"\$\.final\.kept_nodes should be a list"):
        parse_result(doc)
    with pytest.raises(DataError, match="unknown report format"):
        parse_result({"format": "calibkit-other/1"})


def test_results_hold_no_nan() -> None:
    assert R.finite(float("nan")) is None and R.finite(float("inf")) is None and R.finite(1) == 1.0


def test_the_public_api_is_lazy_and_complete() -> None:
    code = ("import sys, calibkit as ck; heavy = [m for m in ('onnxruntime', 'torch', 'transformers', 'onnx', "
            "'numpy') if m in sys.modules]; assert not heavy, heavy; "
            "assert callable(ck.compare) and callable(ck.tune) and callable(ck.load_report); "
            "assert ck.Comparison.__name__ == 'Comparison'; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    import calibkit as ck

    for name in ("sample", "smooth", "calibrate", "build", "compare", "tune", "load_report"):
        assert callable(getattr(ck, name)) and name in ck.__all__
    with pytest.raises(AttributeError):
        ck.nope  # noqa: B018


def test_ck_compare_returns_a_comparison_and_load_report_reads_it_back(tmp_path: Path) -> None:
    from test_compare_tiny import build_engines

    import calibkit as ck
    from calibkit._io import write_json

    paths = build_engines(tmp_path)
    c = ck.compare(paths["fp"], paths["int8"], paths["eval"], batch_size=16, sensitivity=False, limit=60)
    assert isinstance(c, ck.Comparison)
    assert 0.0 <= c.agreement <= 1.0 and c.engines[0].accuracy is not None
    assert c.eval_set.count == 60 and c.eval_set.rows is not None and c.eval_set.labelled
    assert [v.node for v in c.layers] == ["fc1", "fc2", "classifier"]
    write_json(tmp_path / "c.json", to_document(c))
    assert ck.load_report(tmp_path / "c.json") == c


def test_ck_compare_validates_like_the_cli(tmp_path: Path) -> None:
    from test_compare_tiny import build_engines

    import calibkit as ck

    paths = build_engines(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(Path(paths["eval"]).read_text() + '{"text": "good movie", "label": "neutral"}\n')
    with pytest.raises(ck.DataError, match="does not know"):
        ck.compare(paths["fp"], paths["int8"], bad, limit=10, layers=False)
    with pytest.raises(ck.UsageError, match="batch-size"):
        ck.compare(paths["fp"], paths["int8"], paths["eval"], batch_size=0)


def test_ck_calibrate_stays_the_api_after_its_subpackage_is_imported() -> None:
    import calibkit as ck
    import calibkit.calibrate.pipeline as pipeline
    from calibkit.api import calibrate

    assert ck.calibrate.pipeline is pipeline  # the subpackage is still reachable by attribute
    assert ck.calibrate.__doc__ == calibrate.__doc__
    with pytest.raises(ck.UsageError, match="unknown --method"):
        ck.calibrate("model", "cset", method="nope")
