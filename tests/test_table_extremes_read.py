"""calibration.json's observed extremes are verified on read against the statistics written beside them: the
onnxruntime layout's uint8 grid is fitted to them (TensorRange.uint8_grid), so an edited or corrupted extreme
would change every zero point and scale it feeds without a word. Each table here is one ``calibkit.calibrate``
wrote on the tiny test model, edited the way a hand or a broken copy would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from calib_helpers import texts, write_model_dir
from cli_helpers import flat, run

import calibkit as ck
from calibkit.data.calibset import write_calibration_set
from calibkit.errors import CalibrationError
from calibkit.quantize.tablefile import load_calibration_json
from calibkit.types import CalibrationTable


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("extremes")
    mp = pytest.MonkeyPatch()
    mp.setenv("CALIBKIT_CACHE", str(tmp / "cache"))
    write_model_dir(tmp / "model")
    write_calibration_set(tmp / "set", texts(20, seed=3), None)
    ck.calibrate(tmp / "model", tmp / "set", tmp / "cal", method="minmax", target="onnxruntime")
    mp.undo()
    return tmp


def _doc(calibrated: Path) -> dict[str, Any]:
    return json.loads((calibrated / "cal" / "calibration.json").read_text())


def _two_sided(doc: dict[str, Any]) -> dict[str, Any]:
    """The range whose extremes straddle 0 with min != -max (the grid is fitted, not symmetric), of the longest
    name (a one-letter tensor would be found in any message)."""
    return max((r for r in doc["table"]["ranges"] if r["observed_min"] < 0 < r["observed_max"]
                and r["observed_min"] != -r["observed_max"]), key=lambda r: len(r["tensor"]))


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "calibration.json").write_text(json.dumps(doc))
    return tmp_path / "calibration.json"


def _refused(path: Path, *needles: object) -> CalibrationError:
    with pytest.raises(CalibrationError) as exc:
        load_calibration_json(path)
    text = f"{exc.value.message} {exc.value.hint}"
    assert str(path) in text and "calibkit calibrate" in (exc.value.hint or ""), text
    for n in needles:
        assert repr(n) in text or str(n) in text, (n, text)
    return exc.value


@pytest.mark.parametrize("end", ["observed_min", "observed_max"])
def test_an_edited_extreme_is_refused_naming_the_file_the_tensor_and_both_values(calibrated: Path, tmp_path: Path,
                                                                                 end: str) -> None:
    doc = _doc(calibrated)
    r = _two_sided(doc)
    recorded = doc["tensors"][r["tensor"]]["min" if end == "observed_min" else "max"]
    assert r[end] == recorded  # calibrate writes both from one measurement
    r[end] = recorded / 2  # still inside [-amax, amax] and straddling 0: only the statistics tell
    edited = CalibrationTable.from_dict(doc["table"]).get(r["tensor"])
    original = CalibrationTable.from_dict(_doc(calibrated)["table"]).get(r["tensor"])
    assert edited is not None and original is not None and edited.uint8_grid() != original.uint8_grid()
    path = _write(tmp_path / "t", doc)
    _refused(path, r["tensor"], recorded / 2, recorded)
    # the CLI: exit 5, the tensor named, nothing written
    out = tmp_path / "int8.onnx"
    res = run("build", calibrated / "model", "--precision", "int8", "--calibration", path, "-o", out)
    assert res.exit_code == 5 and r["tensor"] in flat(res) and "hint:" in res.output and not out.exists(), res.output
    # a table without the statistics block, or without the extremes, is read as before
    del doc["tensors"]
    load_calibration_json(_write(tmp_path / "no-stats", doc))
    doc = _doc(calibrated)
    for rng in doc["table"]["ranges"]:
        del rng["observed_min"], rng["observed_max"]
    assert all(x.observed_min is None for x in load_calibration_json(_write(tmp_path / "none", doc)).table.ranges)


def test_one_float32_step_off_is_refused_while_the_float32_spelling_is_read(calibrated: Path, tmp_path: Path) -> None:
    doc = _doc(calibrated)
    r = _two_sided(doc)
    # the extremes written as float32 (the shortest repr that rounds back to the same float32) are the same values
    for rng in doc["table"]["ranges"]:
        for end in ("observed_min", "observed_max"):
            rng[end] = float(str(np.float32(rng[end])))
    load_calibration_json(_write(tmp_path / "f32", doc))
    # one float32 step further is another measurement
    stepped = float(np.nextafter(np.float32(r["observed_max"]), np.float32(0)))
    r["observed_max"] = stepped
    _refused(_write(tmp_path / "step", doc), r["tensor"], stepped)


@pytest.mark.parametrize("case", ["outside", "short of absmax"])
def test_extremes_against_a_recorded_absmax_alone(calibrated: Path, tmp_path: Path, case: str) -> None:
    doc = _doc(calibrated)
    r = _two_sided(doc)
    stats = doc["tensors"][r["tensor"]]
    del stats["min"], stats["max"]  # only the absmax recorded: the extremes must still lie within it and reach it
    absmax = stats["absmax"]
    load_calibration_json(_write(tmp_path / "as-written", doc))
    if case == "outside":  # the grid keeps [-amax, amax] but is fitted to a minimum no value reached
        r["observed_min"] = -absmax * 3
        want = -absmax * 3
    else:
        r["observed_min"], r["observed_max"] = r["observed_min"] / 4, r["observed_max"] / 4
        want = r["observed_min"]
    _refused(_write(tmp_path / "edited", doc), r["tensor"], want, absmax)


@pytest.mark.parametrize("edit", ["numeric string", "true", "only observed_min", "only observed_max",
                                  "an integer past any float"])
def test_extremes_that_are_not_two_numbers_are_refused_naming_the_tensor(calibrated: Path, tmp_path: Path,
                                                                         edit: str) -> None:
    # a numeric string and true were read as numbers (true as 1.0: a grid fitted to [min, 1]); one extreme
    # alone was "KeyError: 'observed_max'"; 10**400 was "unexpected OverflowError ... a bug in calibkit"
    doc = _doc(calibrated)
    del doc["tensors"]  # nothing to compare with: the extremes alone must be two numbers
    r = _two_sided(doc)
    if edit == "numeric string":
        r["observed_min"] = str(r["observed_min"])
    elif edit == "true":
        r["observed_max"] = True
    elif edit.startswith("only"):
        del r["observed_max" if edit.endswith("min") else "observed_min"]
    else:
        r["observed_max"] = 10**400
    path = _write(tmp_path / "t", doc)
    err = _refused(path, r["tensor"])
    assert "observed_m" in err.message
    res = run("build", calibrated / "model", "--precision", "int8", "--calibration", path, "-o", tmp_path / "q.onnx")
    assert res.exit_code == 5 and "bug in calibkit" not in res.output, res.output


@pytest.mark.parametrize("where", ["amax", "absmax", "min"])
def test_an_integer_past_any_float_in_a_range_or_its_statistics_is_refused_not_a_crash(calibrated: Path,
                                                                                       tmp_path: Path,
                                                                                       where: str) -> None:
    # JSON reads 1e400 as inf (refused) but 10**400 written out as digits as an int: float() of it raised
    # OverflowError, reported as "a bug in calibkit" with exit 1
    doc = _doc(calibrated)
    r = _two_sided(doc)
    if where == "amax":
        r["amax"] = 10**400
    else:
        doc["tensors"][r["tensor"]][where] = 10**400
    path = _write(tmp_path / "t", doc)
    _refused(path, where)
    res = run("build", calibrated / "model", "--precision", "int8", "--calibration", path, "-o", tmp_path / "q.onnx")
    assert res.exit_code == 5 and "hint:" in res.output and "bug in calibkit" not in res.output, res.output


@pytest.mark.parametrize("scale", [1 / 100, 1e7])
def test_without_statistics_the_amax_is_judged_against_the_extremes(calibrated: Path, tmp_path: Path,
                                                                    scale: float) -> None:
    # a table tune writes has no `tensors` block: extremes shrunk 100x fitted the uint8 grid to a sliver of the
    # range (every value clipped) and were read without a word; the same rule as amax against statistics holds
    doc = _doc(calibrated)
    del doc["tensors"]
    r = _two_sided(doc)
    r["observed_min"], r["observed_max"] = r["observed_min"] * scale, r["observed_max"] * scale
    err = _refused(_write(tmp_path / "t", doc), r["tensor"], "observed extremes")
    assert repr(r["amax"]) in err.message


def test_a_tensor_with_two_ranges_is_refused_naming_it(calibrated: Path, tmp_path: Path) -> None:
    # a range copied in twice with another amax and other extremes was read: table.get() gave the first, the
    # Q/DQ writer's grids, table.amax() and the TensorRT cache the last, without a word
    doc = _doc(calibrated)
    del doc["tensors"]
    r = _two_sided(doc)
    doc["table"]["ranges"].append({**r, "amax": r["amax"] / 2, "observed_min": r["observed_min"] / 2,
                                   "observed_max": r["observed_max"] / 2})
    _refused(_write(tmp_path / "t", doc), r["tensor"], "more than one range")


@pytest.mark.parametrize("edit", ["nan amax", "extremes shrunk", "amax a string"])
def test_a_bare_table_document_is_checked_as_calibration_json_is(calibrated: Path, tmp_path: Path, edit: str) -> None:
    """tune writes each candidate table as a bare table document in its work folder and builds its plans from
    them: such a document gets the same checks as calibration.json's table."""
    from calibkit.evaluate.jobs import load_calibration_table

    table = _doc(calibrated)["table"]
    path = tmp_path / "table-mse.json"
    path.write_text(json.dumps(table))
    assert load_calibration_table(path) == load_calibration_json(calibrated / "cal").table
    r = _two_sided({"table": table})
    if edit == "nan amax":
        r["amax"] = float("nan")
    elif edit == "extremes shrunk":
        r["observed_min"], r["observed_max"] = r["observed_min"] / 1000, r["observed_max"] / 1000
    else:
        r["amax"] = "1.5"
    path.write_text(json.dumps(table))
    with pytest.raises(CalibrationError) as exc:
        load_calibration_table(path)
    assert r["tensor"] in str(exc.value) and "calibkit tune" in (exc.value.hint or "")
