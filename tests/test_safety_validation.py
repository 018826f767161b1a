"""Values are checked where they enter: every numeric option of every command and every ``ck.*`` function refuses
NaN, infinities, wrong types and out-of-range values before any work; CI gates print the digits that decided
them; report documents are checked (format version, size, whole numbers, every value's domain) when read."""

from __future__ import annotations

import inspect
import json
import math
import typing
from pathlib import Path

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import calibkit as ck
import calibkit.api
import calibkit.results.codec as codec
from calibkit.cli import app
from calibkit.errors import DataError, UsageError
from calibkit.results.codec import COMPARE_FORMAT, load_document, load_result, parse_result

runner = CliRunner()


# ------------------------------------------------------------------------------------------------ CI gates


def _comparison(agreement: float, acc_a: float | None = None, acc_b: float | None = None) -> object:
    doc: dict[str, object] = {"format": COMPARE_FORMAT, "agreement": agreement}
    if acc_a is not None:
        doc["engines"] = [{"name": "A", "accuracy": acc_a}, {"name": "B", "accuracy": acc_b}]
    return parse_result(doc, strict=False)


def test_a_missed_gate_shows_the_digits_that_decided_it() -> None:
    missed = calibkit.api.missed_targets(_comparison(0.841584), min_agreement=84.16)
    assert missed == ("agreement 84.158 % is below --min-agreement 84.160 %",)
    missed = calibkit.api.missed_targets(_comparison(0.9, 0.9, 0.894999), max_drop=0.5)
    assert missed == ("accuracy drop 0.5001 points is above --max-drop 0.5000",)
    # a value that differs at the printed precision keeps the short form
    assert calibkit.api.missed_targets(_comparison(0.95), min_agreement=99) == (
        "agreement 95.00 % is below --min-agreement 99 %",)
    assert calibkit.api.missed_targets(_comparison(0.8416), min_agreement=84.16) == ()


@pytest.mark.parametrize("option", ["--max-drop", "--min-agreement"])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999"])
def test_a_gate_of_nan_or_infinity_is_refused_while_parsing(tmp_path: Path, option: str, value: str) -> None:
    """``--max-drop nan`` switched the gate off (every comparison with NaN is false): exit 0 with B worse."""
    r = runner.invoke(app, ["compare", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), option, value])
    assert r.exit_code == 2 and "not a finite number" in r.output, r.output
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------- every numeric CLI option


def _numeric_options() -> list[tuple[str, str, object]]:
    """(command, option, its parser) for every int or float option of every command, read from the typer
    signatures (what typer builds the parser from)."""
    found = []

    def walk(t: typer.Typer, prefix: str) -> None:
        for info in t.registered_commands:
            name = f"{prefix} {info.name or info.callback.__name__}".strip()  # type: ignore[union-attr]
            for p in inspect.signature(info.callback).parameters.values():  # type: ignore[arg-type]
                ann = p.annotation  # a string (``from __future__ import annotations``) or a type (generated)
                kinds = ann.replace(" ", "").split("|") if isinstance(ann, str) else \
                    [getattr(a, "__name__", str(a)) for a in typing.get_args(ann) or (ann,)]
                if isinstance(p.default, typer.models.OptionInfo) and {"int", "float"} & set(kinds):
                    found.append((name, p.default.param_decls[0], p.default.parser))
        for group in t.registered_groups:
            walk(group.typer_instance, f"{prefix} {group.name}".strip())  # type: ignore[arg-type]

    walk(app, "")
    return found


NUMERIC = _numeric_options()


def test_every_numeric_option_goes_through_the_shared_parser() -> None:
    """FLOAT or INTEGER, or (an option that also takes a keyword: `--profiles auto`, `--alpha auto`) the
    keyword_or parser, which reads the number with one of them."""
    assert len(NUMERIC) > 40
    shared = (calibkit.cli._common.FLOAT, calibkit.cli._common.INTEGER)
    plain = [f"{cmd} {opt}" for cmd, opt, parser in NUMERIC
             if parser not in shared and getattr(parser, "number", None) not in shared]
    assert plain == [], "parse these with parser=FLOAT / parser=INTEGER (calibkit.cli._common)"
    keyworded = {f"{cmd} {opt}" for cmd, opt, parser in NUMERIC if parser not in shared}
    assert keyworded == {"deploy --profiles", "smooth --alpha"}


@given(st.sampled_from(NUMERIC), st.sampled_from(["nan", "-nan", "inf", "-Infinity", "1e999", "x", "", "0x10",
                                                  "1,5", "-" + "9" * 5000]))
def test_every_numeric_option_refuses_a_non_number_before_anything_runs(
        tmp_path_factory: pytest.TempPathFactory, case: tuple[str, str, object], value: str) -> None:
    command, option, _ = case
    work = tmp_path_factory.mktemp("opt")
    args = [*command.split(), str(work / "in"), str(work / "in2"), option, value]
    mp = pytest.MonkeyPatch()
    mp.chdir(work)  # a command that ran would write under the current folder (runs/, reports/)
    try:
        r = runner.invoke(app, args)
    finally:
        mp.undo()
    assert r.exit_code == 2 and "Invalid value for" in r.output and "Traceback" not in r.output, (args, r.output)
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("value", ["1.5", "1e3", "0.0"])
def test_a_whole_number_option_refuses_a_fraction(tmp_path: Path, value: str) -> None:
    r = runner.invoke(app, ["sample", str(tmp_path / "log.jsonl"), "--size", value])
    assert r.exit_code == 2 and "not a whole number" in r.output, r.output


# ------------------------------------------------------------------------------- every numeric API argument


def _numeric_params(fn: object) -> list[inspect.Parameter]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY
            and any(t in str(p.annotation).replace(" ", "").split("|") for t in ("int", "float", "str|int"))]


API = {name: getattr(calibkit.api, name)
       for name in ("export", "sample", "smooth", "calibrate", "build", "compare", "tune", "deploy")}
API_PARAMS = [(name, p) for name, fn in API.items() for p in _numeric_params(fn)]
HOSTILE = [math.nan, math.inf, -math.inf, -1, 10 ** 30, -(10 ** 30), "0.5", True, [1], 8.5, 1e300]


def _positional(name: str, work: Path) -> list[object]:
    missing = work / "missing"
    return {"export": [missing / "model.onnx", work / "out"],
            "deploy": [missing / "runs", work / "out"],
            "sample": [missing / "log.jsonl", work / "out"],
            "smooth": [missing / "model", missing / "set", work / "out"],
            "calibrate": [missing / "model", missing / "set", work / "out"],
            "build": [missing / "model.onnx", work / "out.onnx"],
            "compare": [missing / "a.onnx", missing / "b.onnx", missing / "eval.jsonl"],
            "tune": [missing / "model", missing / "set", missing / "eval.jsonl", work / "out"]}[name]


def test_every_api_function_has_its_numbers_checked() -> None:
    names = {(n, p.name) for n, p in API_PARAMS}
    assert {("tune", "max_drop"), ("tune", "holdout"), ("sample", "size"), ("compare", "traffic_size"),
            ("calibrate", "percentile"), ("build", "workspace_mib"), ("smooth", "alpha"), ("export", "tolerance"),
            ("deploy", "profiles"), ("deploy", "queue_delay_us"), ("deploy", "measure_texts")} <= names


@given(st.sampled_from(API_PARAMS), st.sampled_from(HOSTILE))
def test_every_api_number_is_refused_before_any_work(tmp_path_factory: pytest.TempPathFactory,
                                                     case: tuple[str, inspect.Parameter], value: object) -> None:
    """NaN, infinities, huge, negative and wrong-typed values: a UsageError naming the option, before any
    input is read (the inputs do not exist: reading one would be a DataError or ModelError) or output made."""
    name, param = case
    if param.name == "memory_budget" and value == "0.5":
        value = "-1G"
    if value == 8.5 and "float" in str(param.annotation):  # a fraction is hostile to whole numbers only
        value = -1e300
    if param.name == "seed" and value == 8.5:
        value = 2 ** 32
    work = tmp_path_factory.mktemp("api")
    with pytest.raises(UsageError) as err:
        API[name](*_positional(name, work), **{param.name: value})
    assert param.name.replace("_", "-") in err.value.message or "size" in err.value.message, err.value.message
    assert list(work.iterdir()) == []


def _path_params(fn: object) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
            if "PathLike" in str(p.annotation)]


PATH_PARAMS = [(name, p) for name, fn in API.items() for p in _path_params(fn)]


@given(st.sampled_from(PATH_PARAMS), st.sampled_from([5, 1.5, True, [], b"bytes", object()]))
def test_every_api_path_of_the_wrong_type_is_a_usage_error(tmp_path_factory: pytest.TempPathFactory,
                                                           case: tuple[str, inspect.Parameter], value: object) -> None:
    """A number where a path goes was a TypeError from pathlib (or worse, after work had started)."""
    name, param = case
    work = tmp_path_factory.mktemp("api")
    args = _positional(name, work)
    names = list(inspect.signature(API[name]).parameters)
    kwargs: dict[str, object] = {}
    if names.index(param.name) < len(args):
        args[names.index(param.name)] = value
    else:
        kwargs[param.name] = value
    with pytest.raises(UsageError, match=f"{param.name} must be a path"):
        API[name](*args, **kwargs)
    assert list(work.iterdir()) == []


def _name_params(fn: object) -> list[inspect.Parameter]:
    kinds = ("str", "str | None", "Sequence[str]")
    return [p for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
            if p.kind is p.KEYWORD_ONLY and str(p.annotation) in kinds]


NAME_PARAMS = [(name, p) for name, fn in API.items() for p in _name_params(fn)]


@given(st.sampled_from(NAME_PARAMS), st.sampled_from([5, [5], object(), b"bytes", "as-a-list", None]))
def test_every_api_name_of_the_wrong_type_is_a_usage_error(tmp_path_factory: pytest.TempPathFactory,
                                                           case: tuple[str, inspect.Parameter], value: object) -> None:
    """``text_field=5``, ``exclude="fc1"``, ``target=[5]``: AttributeError and TypeError from deep inside."""
    name, param = case
    listed = str(param.annotation).startswith("Sequence")
    if (value == "as-a-list" and not listed) or (value is None and param.default is None):
        return  # a string where a string goes, None where None is the default: not hostile
    work = tmp_path_factory.mktemp("api")
    with pytest.raises(UsageError, match=f"{param.name} must be a (list of )?string"):
        API[name](*_positional(name, work), **{param.name: value})
    assert list(work.iterdir()) == []


def test_tune_refuses_an_unknown_task_before_reading_the_model(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown --task 'x'"):
        ck.tune(tmp_path / "no-model", tmp_path / "no-set", tmp_path / "no-eval.jsonl", task="x")


@pytest.mark.parametrize("kwargs, option", [
    ({"max_drop": math.nan}, "--max-drop"), ({"max_drop": "0.5"}, "--max-drop"), ({"holdout": math.inf}, "--holdout"),
    ({"percentile": math.nan}, "--percentile"), ({"agreement_confidence": math.nan}, "--agreement-confidence"),
])
def test_tune_refuses_a_bad_number_before_reading_the_model(tmp_path: Path, kwargs: dict, option: str) -> None:
    with pytest.raises(UsageError, match=option):
        ck.tune(tmp_path / "no-model", tmp_path / "no-set", tmp_path / "no-eval.jsonl", tmp_path / "out", **kwargs)


def test_sample_refuses_a_fractional_size_before_reading_the_log(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"text": "a"}\n')
    with pytest.raises(UsageError, match="--size must be a whole number"):
        ck.sample(log, tmp_path / "out", size=8.5)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


def test_percentile_nan_is_refused_at_parse_time_not_after_calibration(tmp_path: Path) -> None:
    r = runner.invoke(app, ["tune", str(tmp_path / "model"), "-c", str(tmp_path / "set"), "--percentile", "nan"])
    assert r.exit_code == 2 and "not a finite number" in r.output and "re-run" not in r.output, r.output


# ---------------------------------------------------------------------------------------- report documents


def _write(tmp_path: Path, doc: object, name: str = "report.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_a_newer_format_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = _write(tmp_path, {"format": "calibkit-compare/99", "agreement": 0.9})
    for read in (load_result, ck.load_report, load_document):
        with pytest.raises(DataError, match=r"calibkit-compare/99 is not the calibkit-compare/1"):
            read(path)
    with pytest.raises(DataError, match="no version number"):
        load_result(_write(tmp_path, {"format": "calibkit-compare/one"}))


@pytest.mark.parametrize("field, value, said", [
    ("agreement", 7.5, r"\$\.agreement should be a share in \[0, 1\], not 7\.5"),
    ("flip_rate", -0.1, "flip_rate should be a share"),
    ("seed", -3, "should be a count or index"),
])
def test_a_value_outside_its_domain_is_refused(tmp_path: Path, field: str, value: object, said: str) -> None:
    path = _write(tmp_path, {"format": COMPARE_FORMAT, field: value})
    with pytest.raises(DataError, match=said):
        load_document(path)  # what `calibkit report` reads
    r = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 3 and "report.json" in r.output and not (tmp_path / "rep").exists(), r.output


def test_nested_values_are_checked_by_the_field_that_holds_them(tmp_path: Path) -> None:
    good = {"format": COMPARE_FORMAT, "engines": [{"name": "A", "accuracy": 0.9, "accuracy_ci": {
        "estimate": 0.9, "low": 0.85, "high": 0.94}}], "differences": {"accuracy": {
            "estimate": -0.02, "low": -0.05, "high": 0.01, "a_only": 3, "b_only": 1, "n": 100, "mcnemar_p": 0.6}},
        "outputs": {"cosine_mean": 0.9999, "cosine_min": -0.2}}
    load_result(_write(tmp_path, good), strict=False)  # a negative difference of shares is a difference
    good["engines"][0]["accuracy_ci"]["high"] = 1.2  # type: ignore[index]
    with pytest.raises(DataError, match=r"accuracy_ci\.high should be a share"):
        load_result(_write(tmp_path, good), strict=False)
    # a task's extra measures are named by the model's heads: only the name's ending says it is a share
    task = {"format": COMPARE_FORMAT, "task": {"kind": "regression", "output": "score", "labelled": True, "fidelity": {
        "agreement": 0.5, "cosine_mean": 0.99, "cosine_min": 0.9, "fraction_mae_vs_labels": 3.5, "k": 10.0}}}
    load_result(_write(tmp_path, task), strict=False)
    task["task"]["fidelity"]["fraction_micro_f1"] = 1.5  # type: ignore[index]
    with pytest.raises(DataError, match=r"fraction_micro_f1 should be a share"):
        load_result(_write(tmp_path, task), strict=False)


def test_a_huge_whole_number_is_a_data_error(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"format": "calibkit-compare/1", "seed": ' + "7" * 5000 + "}")
    with pytest.raises(DataError, match="5000 digits"):
        load_result(path)
    r = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 3 and "digits" in r.output, r.output
    with pytest.raises(DataError, match="at most 9223372036854775807"):
        load_result(_write(tmp_path, '{"format": "calibkit-compare/1", "seed": 1e30}'), strict=False)


def test_an_oversized_report_is_refused_before_it_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    path = tmp_path / "report.json"
    with open(path, "wb") as fh:  # sparse: the size the check sees, without the disk
        fh.truncate(getattr(codec, "MAX_DOCUMENT_BYTES", 64 << 20) + 1)
    parsed = []
    monkeypatch.setattr(codec.json, "loads", lambda *a, **k: parsed.append(1))
    with pytest.raises(DataError, match="MiB; a report document is at most"):
        load_document(path)
    assert parsed == []


def test_the_documents_calibkit_writes_pass_their_own_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The domain table names real fields: a compare and a tune document of a real (tiny) run are read back."""
    from calib_helpers import texts, write_model_dir

    from calibkit.data.calibset import write_calibration_set

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    cset = write_calibration_set(tmp_path / "set", texts(16, seed=3), None)
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"text": t, "label": ["negative", "positive"][i % 2]}) + "\n"
                          for i, t in enumerate(texts(60, seed=5))))
    run = ck.tune(model, cset, ev, tmp_path / "tune", max_evaluations=2, sensitivity_samples=8, workers=1,
                  smooth=False, traffic=None)
    assert load_result(tmp_path / "tune" / "tune.json") == run.result
    cal = ck.calibrate(model, cset, tmp_path / "cal", method="minmax")
    a = ck.build(model, tmp_path / "e" / "fp32.onnx", precision="fp32")
    b = ck.build(model, tmp_path / "e" / "int8.onnx", precision="int8", qdq=cal.model_path)
    c = ck.compare(a.artifact, b.artifact, ev, workers=1, sensitivity_samples=16, traffic=None)
    codec.check_domains(c)
    assert load_result(_write(tmp_path, codec.to_document(c), "compare.json")) == c
