"""Requests are values declared once: each option of `calibkit export`, `sample`, `smooth`, `calibrate`, `build`,
`compare`, `tune` and `deploy` is one request field (or a resource option) and back, a request survives the trip
through its command line, the API's keyword functions are generated from the same fields, `--traffic` reads a word
by one rule, a keyword-or-number option (`--profiles`, `--alpha`) is a typed value, and no module declares the
options again."""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import calibkit.api
from calibkit.cli import app
from calibkit.cli import build as cli_build
from calibkit.cli import calibrate as cli_calibrate
from calibkit.cli import compare as cli_compare
from calibkit.cli import deploy as cli_deploy
from calibkit.cli import export as cli_export
from calibkit.cli import sample as cli_sample
from calibkit.cli import smooth as cli_smooth
from calibkit.cli import tune as cli_tune
from calibkit.errors import UsageError
from calibkit.requests.build import BuildRequest
from calibkit.requests.calibrate import CalibrateRequest
from calibkit.requests.choices import Target
from calibkit.requests.compare import CompareRequest
from calibkit.requests.deploy import DeployRequest, Profiles
from calibkit.requests.export import ExportRequest
from calibkit.requests.options import Choice, declared, flag_of
from calibkit.requests.resources import ResourceOptions
from calibkit.requests.sample import SampleRequest
from calibkit.requests.smooth import Alpha, SmoothRequest
from calibkit.requests.traffic import Traffic
from calibkit.requests.tune import TuneRequest
from calibkit.results.flags import Thresholds
from calibkit.types import Backend, Precision

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"calibrate": (CalibrateRequest, cli_calibrate), "compare": (CompareRequest, cli_compare),
            "tune": (TuneRequest, cli_tune), "sample": (SampleRequest, cli_sample), "build": (BuildRequest, cli_build),
            "deploy": (DeployRequest, cli_deploy), "export": (ExportRequest, cli_export),
            "smooth": (SmoothRequest, cli_smooth)}
DECLARED_ONCE = tuple(COMMANDS)  # every pipeline here takes (request, resources)
#: where each command's options could be declared again (None: every module). sample's options (size, seed,
#: text_field, strict, redact, tokenizer) are also how compare, tune and deploy draw traffic, with their own
#: defaults (evaluate.traffic.TrafficOptions), so only sample's own modules are searched (its API function is
#: generated: test_the_keyword_functions_are_generated_from_the_requests). export and smooth have so few options
#: (source, task, tokenizer; tokenizer, batch_size) that a third of them is any loader's signature: their own
#: modules are searched
SCOPE: dict[str, tuple[str, ...] | None] = {
    "calibrate": None, "compare": None, "tune": None, "build": None, "deploy": None,
    "sample": ("cli/sample.py", "data/sample_pipeline.py"),
    "export": ("cli/export.py", "exporter/pipeline.py", "exporter/torch_export.py", "api.py"),
    "smooth": ("cli/smooth.py", "calibrate/smoothing.py", "quantize/smooth.py", "api.py"),
}


def _click(name: str) -> Any:
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def _owners(request_cls: type) -> dict[str, str]:
    """Each command-line spelling a request declares -> the field it sets."""
    owners: dict[str, str] = {}
    for f, decl in declared(request_cls):
        if not decl.cli:
            continue
        flags = [x for spelled in decl.flags or (flag_of(f, decl),) for x in spelled.split("/")]
        flags += [decl.negation] if decl.negation else []
        flags = [n.flag for n in decl.nested] or flags
        for flag in [f.name] if decl.argument else flags:
            assert flag not in owners, f"{flag} is declared by {owners[flag]} and {f.name}"
            owners[flag] = f.name
    return owners


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_maps_to_exactly_one_field_and_back(command: str) -> None:
    request_cls, module = COMMANDS[command]
    owners = _owners(request_cls)
    resources = {flag_of(f, d): f.name for f, d in declared(ResourceOptions) if f.name in module.RESOURCES}
    own = {name for p in module.PRESENTATION for name in p.default.param_decls}
    seen: dict[str, str] = {}
    for param in _click(command).params:
        spellings = [param.name] if param.param_type_name == "argument" else [*param.opts, *param.secondary_opts]
        for spelled in spellings:
            if spelled == "--help":
                continue
            targets = [t for t in (owners.get(spelled), resources.get(spelled), spelled in own or None) if t]
            assert len(targets) == 1, f"calibkit {command} {spelled} maps to {targets or 'nothing'}"
            seen[spelled] = str(targets[0])
    assert set(owners) <= set(seen), f"fields with no option: {set(owners) - set(seen)}"
    assert set(resources) <= set(seen), f"resource options missing: {set(resources) - set(seen)}"
    cli_fields = {f.name for f, d in declared(request_cls) if d.cli}
    assert cli_fields == {owners[s] for s in seen if s in owners}


def _non_default(request_cls: type, tmp: Path) -> dict[str, Any]:
    """A value other than its default for every field the command line sets (paths under ``tmp``)."""
    if request_cls is BuildRequest:  # options that only fit together: an INT8 ONNX Runtime build from a calibration
        return {"model": tmp / "model", "output": tmp / "int8.onnx", "precision": Precision.INT8,
                "calibration": tmp / "cal", "target": Target.ONNXRUNTIME, "exclude": ("fc1", "fc2"),
                "tokenizer": tmp / "tok", "calibration_set": tmp / "cset", "workspace_mib": 7, "reduce_range": False}
    if request_cls is DeployRequest:  # ONNX Runtime: --threads and --reduce-range apply to it alone
        return {"source": tmp / "runs", "out": tmp / "serving", "traffic": tmp / "requests.jsonl",
                "text_field": "request.text", "strict": True, "redact": False, "profiles": 3, "name": "served",
                "max_seq": 64, "batch_tokens": 4096, "max_batch": 16, "queue_delay_us": 7, "instances": 2,
                "threads": 3, "perf_requests": 9, "max_texts": 99, "seed": 7, "reduce_range": False,
                "workspace_mib": 7, "layout": Target.ONNXRUNTIME, "measure_texts": 0, "measure_batch": 2}
    values: dict[str, Any] = {}
    if request_cls in (ExportRequest, SmoothRequest):  # the command line reads these inputs before the API call
        from calib_helpers import texts, write_model_dir

        from calibkit.data.calibset import write_calibration_set

        model = write_model_dir(tmp / "model")
        values = {"tokenizer": model, **({"source": model / "model.onnx"} if request_cls is ExportRequest else {
            "model": model, "calibration_set": write_calibration_set(tmp / "set", texts(8), None).path})}
    for f, decl in declared(request_cls):
        if not decl.cli or f.name in values:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        kind = str(f.type)
        if f.name == "traffic":
            values[f.name] = tmp / "requests.jsonl"
        elif request_cls is CalibrateRequest and f.name == "calibration_set":
            continue  # from a cache instead: the command line then loads nothing before the API call
        elif kind.startswith("tuple"):
            values[f.name] = ("MatMul", "Conv")
        elif decl.nested:
            values[f.name] = Thresholds(**{n.attribute: 0.25 for n in decl.nested})
        elif isinstance(default, (Profiles, Alpha)):  # a keyword or a number: the number
            values[f.name] = 0.5 if isinstance(default, Alpha) else 2
        elif isinstance(default, Choice):
            values[f.name] = next(m for m in type(default) if m is not default)
        elif isinstance(default, bool):
            values[f.name] = not default
        elif f.name == "task":
            values[f.name] = "classification"
        elif f.name == "seed":
            values[f.name] = 7
        elif f.name == "num_bins":
            values[f.name] = 1024
        elif kind.startswith(("int", "float")):
            bound = decl.bound
            low = bound.low if bound is not None and bound.low is not None else 0
            values[f.name] = (type(default) if default is not None else int if "int" in kind else float)(low + 3)
            if bound is not None and bound.high is not None and values[f.name] > bound.high:
                values[f.name] = type(values[f.name])(bound.high)
            if bound is not None and bound.below is not None and values[f.name] >= bound.below:
                values[f.name] = (low + bound.below) / 2
        elif "PathLike" in kind:
            values[f.name] = tmp / f.name
        else:
            values[f.name] = f"{f.name}-value"
    return values


def _argv(request_cls: type, values: dict[str, Any]) -> list[str]:
    """The command line that asks for ``values``."""
    arguments: list[str] = []
    argv: list[str] = []
    for f, decl in declared(request_cls):
        if f.name not in values:
            continue
        value = values[f.name]
        if decl.argument:
            arguments.append(str(value))
        elif decl.nested:
            argv += [x for n in decl.nested for x in (n.flag, str(getattr(value, n.attribute)))]
        elif isinstance(value, tuple):
            argv += [x for item in value for x in ((decl.flags or (flag_of(f, decl),))[0], item)]
        elif isinstance(value, bool):
            switch = (decl.flags or (flag_of(f, decl),))[0].split("/")
            argv.append(switch[0] if value else switch[1])
        else:
            word = value.value if isinstance(value, enum.Enum) else value
            argv += [(decl.flags or (flag_of(f, decl),))[0], str(word)]
    return arguments + argv


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_request_survives_its_command_line(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """construct -> validate -> its command line -> parsed back: the same request reaches ``calibkit.api.run``."""
    request_cls, _ = COMMANDS[command]
    values = _non_default(request_cls, tmp_path)
    expected = request_cls(**values)
    expected.validate()
    got: list[Any] = []

    def stop(request: Any, resources: ResourceOptions, progress: Any = None) -> Any:
        got.append((request, resources))
        raise UsageError("stopped by the test")

    monkeypatch.setattr(calibkit.api, "run", stop)
    monkeypatch.chdir(tmp_path)
    quiet = ["--no-report"] if command == "compare" else []  # tune's --report is a field, calibrate has none
    budget = ["--memory-budget", "3G"] if "memory_budget" in COMMANDS[command][1].RESOURCES else []
    result = CliRunner().invoke(app, [command, *_argv(request_cls, values), *quiet, *budget])
    assert got, result.output
    request, resources = got[0]
    assert _as_given(request, expected) == expected
    assert resources == (ResourceOptions(memory_budget="3G") if budget else ResourceOptions())


def _as_given(request: Any, expected: Any) -> Any:
    """``request`` with the inputs its command line loaded before the API call (smooth's model and calibration set)
    put back as the paths they were loaded from."""
    from calibkit.data.calibset import CalibrationSet
    from calibkit.data.modeldir import ModelDir

    if isinstance(request, SmoothRequest) and isinstance(request.model, ModelDir):
        assert request.model.onnx_path == expected.model / "model.onnx"
        assert isinstance(request.calibration_set, CalibrationSet)
        assert request.calibration_set.path == expected.calibration_set
        return dataclasses.replace(request, model=expected.model, calibration_set=expected.calibration_set)
    return request


def test_traffic_reads_a_word_as_a_file_where_one_of_that_name_exists(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Traffic.parse("auto") is Traffic.AUTO and Traffic.parse("default") is Traffic.DEFAULT
    (tmp_path / "auto").write_text('{"text": "a log named auto"}\n')
    assert Traffic.parse("auto") == Path("auto")  # the file, with no ./ needed
    assert Traffic.parse(Traffic.AUTO) is Traffic.AUTO  # the keyword, always, from Python
    assert Traffic.parse(Path("default")) == Path("default") and Traffic.parse(None) is None
    assert TuneRequest(model="m", calibration_set="c", traffic="auto").traffic == Path("auto")
    assert CompareRequest(engine_a="a", engine_b="b", traffic="default").traffic is Traffic.DEFAULT


def test_the_keyword_functions_are_generated_from_the_requests() -> None:
    every = ["workers", "executor", "memory_budget", "max_batch_tokens"]
    for function, request_cls, resources in ((calibkit.api.calibrate, CalibrateRequest, every),
                                             (calibkit.api.compare, CompareRequest, every),
                                             (calibkit.api.tune, TuneRequest, every),
                                             (calibkit.api.sample, SampleRequest, []),
                                             (calibkit.api.build, BuildRequest, []),
                                             (calibkit.api.export, ExportRequest, []),
                                             (calibkit.api.smooth, SmoothRequest, every[2:]),
                                             (calibkit.api.deploy, DeployRequest, [])):
        params = inspect.signature(function).parameters
        api_fields = [f.name for f, d in declared(request_cls) if d.api]
        assert list(params) == [*api_fields, *resources, "progress"]
        doc = function.__doc__ or ""
        for f, decl in declared(request_cls):
            assert (f"    {f.name}: " in doc) == decl.api, f"{function.__name__}'s Args: {f.name}"
    assert inspect.signature(calibkit.api.tune).parameters["max_drop"].default == 0.5
    assert str(inspect.signature(calibkit.api.compare).parameters["batch_size"]) == "batch_size: int = 32"
    with pytest.raises(TypeError, match="no_such_option"):
        calibkit.api.tune("model", "cset", no_such_option=1)


def test_validate_keeps_the_messages_that_say_what_to_do() -> None:
    with pytest.raises(UsageError, match="unknown --method 'fast'") as e:
        TuneRequest(model="m", calibration_set="c", method="fast").validate()
    assert "entropy" in (e.value.hint or "")
    with pytest.raises(UsageError, match="--min-agreement must be a percentage in"):
        CompareRequest(engine_a="a", engine_b="b", eval_set="e", min_agreement=101).validate()
    with pytest.raises(UsageError, match="--threshold-clipped"):
        CompareRequest(engine_a="a", engine_b="b", eval_set="e", thresholds=Thresholds(max_clipped_fraction=2)
                       ).validate()
    with pytest.raises(UsageError, match="compare needs texts"):
        CompareRequest(engine_a="a", engine_b="b", traffic=None).validate()


@pytest.mark.parametrize(("request_value", "message"), [
    (lambda: SampleRequest(logs="log.jsonl", size=0), "--size must be at least 1, got 0"),
    (lambda: SampleRequest(logs="log.jsonl", size=8.5), "--size must be a whole number"),
    (lambda: SampleRequest(logs="log.jsonl", clusters=0), "--clusters must be at least 1, got 0"),
    (lambda: SampleRequest(logs="log.jsonl", seed=-1), "--seed must be a whole number from 0"),
    (lambda: BuildRequest(model="m", output="e.onnx", precision="bf16"), "unknown --precision 'bf16'"),
    (lambda: BuildRequest(model="m", output="e.engine"), "an ONNX Runtime engine is an .onnx file"),
    (lambda: BuildRequest(model="m", output="e.onnx", precision="int8"),
     "--precision int8 needs exactly one of --calibration and --qdq"),
    (lambda: BuildRequest(model="m", output="e.onnx", max_seq=128), "--min-seq/--opt-seq/--max-seq only apply"),
    (lambda: BuildRequest(model="m", output="e.onnx", workspace_mib=0), "--workspace-mib must be"),
    (lambda: BuildRequest(model="m", output="e.onnx", exclude=["("]), "is not a valid regular expression"),
], ids=["size-0", "size-fraction", "clusters-0", "seed", "precision", "suffix", "int8-source", "seq", "workspace",
        "regex"])
def test_sample_and_build_requests_validate_with_the_messages_of_before(request_value: Any, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        request_value().validate()


def _parsed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str]) -> tuple[Any, str]:
    """The request the command line hands to ``calibkit.api.run`` (None: refused before), and what it printed."""
    got: list[Any] = []

    def stop(request: Any, resources: ResourceOptions, progress: Any = None) -> Any:
        got.append(request)
        raise UsageError("stopped by the test")

    monkeypatch.setattr(calibkit.api, "run", stop)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "400"})
    return (got[0] if got else None), " ".join(result.output.replace("│", " ").split())


def test_build_exclude_takes_a_regex_with_a_comma_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`build -x 'layer{1,3}'` was split at the comma into two broken patterns; an --exclude is one regex, as in
    calibrate."""
    request, said = _parsed(monkeypatch, tmp_path, ["build", "model", "-p", "fp16", "-x", "layer{1,3}/", "-o",
                                                    "fp16.onnx"])
    assert request is not None, said
    assert request.exclude == ("layer{1,3}/",)


# ---------------------------------------------------------------- declared once

def _option_names(request_cls: type) -> set[str]:
    return {f.name for f, d in declared(request_cls) if d.api}


def _records_nothing(value: ast.expr) -> bool:
    if isinstance(value, ast.Constant):
        return value.value is None
    return isinstance(value, ast.Call) and getattr(value.func, "id", "") == "absent"


def _redeclarations(tree: ast.AST, names: set[str]) -> list[str]:
    """Functions and classes that give a default to a third or more of ``names`` (an option table again)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            defaulted = [x.arg for x in a.args[len(a.args) - len(a.defaults):]]
            defaulted += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        elif isinstance(node, ast.ClassDef):
            # a field defaulting to None (or to absent()) records that nothing was given: not an option's default
            defaulted = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and s.value is not None
                         and isinstance(s.target, ast.Name) and not _records_nothing(s.value)]
        else:
            continue
        if len(set(defaulted) & names) * 3 >= len(names):
            found.append(f"{node.name} (line {node.lineno})")
    return found


def _typer_flags(tree: ast.AST) -> set[str]:
    return {a.value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") in ("Option", "Argument")
            for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")}


def test_no_module_declares_a_commands_options_again() -> None:
    wrong = []
    for path in sorted((ROOT / "calibkit").rglob("*.py")):
        if "requests" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT / "calibkit").as_posix()
        for cls in (COMMANDS[c][0] for c in DECLARED_ONCE if SCOPE[c] is None or where in SCOPE[c]):  # type: ignore
            wrong += [f"{path.relative_to(ROOT)}: {x} re-declares {cls.__name__}'s options"
                      for x in _redeclarations(tree, _option_names(cls))]
        if path.parent.name == "cli" and path.stem in DECLARED_ONCE:
            wrong += [f"{path.relative_to(ROOT)}: typer option {x} re-declares a request field"
                      for x in _typer_flags(tree) & set(_owners(COMMANDS[path.stem][0]))]
    assert not wrong, "\n".join(wrong)


def test_the_redeclaration_check_finds_an_option_table() -> None:
    """The check above is not vacuous: the keyword signature the API had before requests is found."""
    old = "def tune(model, calibration_set, eval_set=None, out=None, *, " + ", ".join(
        f"{n}=None" for n in sorted(_option_names(TuneRequest))) + "): pass"
    assert _redeclarations(ast.parse(old), _option_names(TuneRequest)) == ["tune (line 1)"]
    assert _typer_flags(ast.parse('typer.Option(0.5, "--max-drop")')) == {"--max-drop"}


# ---------------------------------------------------------------- a keyword or a number


@pytest.mark.parametrize(("word", "value"), [("auto", Profiles.AUTO), ("AUTO", Profiles.AUTO), ("3", 3)])
def test_profiles_is_auto_or_a_whole_number(word: str, value: Any, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """`--profiles` was a string parsed by its own code ("auto" or int()); it is a typed value now, the number read
    by the parser of every numeric option."""
    request, said = _parsed(monkeypatch, tmp_path, ["deploy", "runs/x", "-o", "serving", "-k", word])
    assert request is not None, said
    assert request.profiles == value and type(request.profiles) is type(value)
    assert request.requested_k == (None if value is Profiles.AUTO else value)
    assert request == DeployRequest(source="runs/x", out="serving", profiles=value)


@pytest.mark.parametrize("word", ["many", "2.5", "nan", ""])
def test_profiles_refuses_anything_else_while_parsing(word: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    request, said = _parsed(monkeypatch, tmp_path, ["deploy", "runs/x", "-o", "serving", "--profiles", word])
    assert request is None and f"{word!r} is neither auto nor a whole number" in said, said


@pytest.mark.parametrize(("value", "message"), [
    (None, "--profiles must be a whole number from 1 to 4 or auto, got None"),
    ("2", "--profiles must be a whole number from 1 to 4 or auto, got '2'"),
    (2.0, "--profiles must be a whole number from 1 to 4 or auto, got 2.0"),
    (True, "--profiles must be a whole number from 1 to 4 or auto, got True"),
    (5, "--profiles 5 is out of range"),
])
def test_profiles_from_python_is_profiles_auto_or_an_int(value: Any, message: str) -> None:
    assert DeployRequest(source="s", out="o", profiles="auto").profiles is Profiles.AUTO
    with pytest.raises(UsageError, match=re.escape(message)):
        DeployRequest(source="s", out="o", profiles=value).validate()


@pytest.mark.parametrize(("word", "value"), [("auto", Alpha.AUTO), ("0.8", 0.8), ("1", 1.0)])
def test_alpha_is_auto_or_a_number(word: str, value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from calib_helpers import texts, write_model_dir

    from calibkit.data.calibset import write_calibration_set

    write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(8), None)
    request, said = _parsed(monkeypatch, tmp_path, ["smooth", "model", "-c", "set", "-o", "out", "--alpha", word])
    assert request is not None and request.alpha == value, said
    assert request.fixed_alpha == (None if value is Alpha.AUTO else value)
    request, said = _parsed(monkeypatch, tmp_path, ["smooth", "model", "-c", "set", "-o", "out", "--alpha", "x"])
    assert request is None and "'x' is neither auto nor a finite number" in said, said


def test_deploy_backend_has_one_default_for_both_callers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line required --backend while ck.deploy defaulted to onnxruntime: one rule now, the default of
    `calibkit build --backend` too."""
    request, said = _parsed(monkeypatch, tmp_path, ["deploy", "runs/x", "-o", "serving"])
    assert request is not None, said
    assert request.backend is Backend.ONNXRUNTIME
    assert inspect.signature(calibkit.api.deploy).parameters["backend"].default is Backend.ONNXRUNTIME
    assert next(f for f in dataclasses.fields(BuildRequest) if f.name == "backend").default is Backend.ONNXRUNTIME


def test_run_runs_every_commands_request() -> None:
    with pytest.raises(UsageError) as e:
        calibkit.api.run("not a request")
    for name in ("DeployRequest", "ExportRequest", "SmoothRequest", "TuneRequest"):
        assert name in (e.value.hint or "")
