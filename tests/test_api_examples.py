"""Every ``ck.*`` function of calibkit/api.py documents its arguments, return value and errors (Google style,
rendered by docs/api.md), and its example runs: the examples are one workflow on a tiny model, run here in
order as doctests, so the printed values are checked too."""

from __future__ import annotations

import doctest
import inspect
import json
from pathlib import Path

import pytest
from calib_helpers import texts, write_model_dir

import calibkit
from calibkit import api

# the order the examples build on each other (export first: its own folder): sample's set feeds smooth and
# calibrate, build's engines compare, tune's folder deploy
ORDER = ("export", "sample", "smooth", "calibrate", "histogram", "build", "compare", "run", "render_report",
         "load_report", "tune", "deploy")
SECTIONS = ("Args:", "Returns:", "Raises:", "Examples:")


def _sections(doc: str) -> dict[str, str]:
    """The Google-style sections of a docstring, by header, each with its indented body."""
    out: dict[str, str] = {}
    current = None
    for line in inspect.cleandoc(doc).splitlines():
        if line in SECTIONS:
            current = line
            out[current] = ""
        elif current is not None and (line.startswith("    ") or not line.strip()):
            out[current] += line + "\n"
        else:
            current = None
    return out


def test_every_public_function_has_an_example_here() -> None:
    assert set(ORDER) == set(calibkit._API)


@pytest.mark.parametrize("name", ORDER)
def test_every_public_function_documents_args_returns_raises_and_an_example(name: str) -> None:
    fn = getattr(api, name)
    sections = _sections(fn.__doc__ or "")
    assert set(SECTIONS) <= set(sections), f"ck.{name} lacks {set(SECTIONS) - set(sections)}"
    documented = {line.split(":")[0].strip() for line in sections["Args:"].splitlines()
                  if line.startswith("    ") and not line.startswith("        ") and ":" in line}
    assert documented == set(inspect.signature(fn).parameters), f"ck.{name}: Args: and the signature differ"
    assert ">>> " in sections["Examples:"]
    for line in sections["Raises:"].splitlines():
        if line.startswith("    ") and not line.startswith("        "):
            assert issubclass(getattr(calibkit.errors, line.split(":")[0].strip()), calibkit.CalibkitError), line


@pytest.fixture()
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """model/ (a tiny text classifier), logs.jsonl (requests) and test.jsonl (labelled), what the examples name."""
    write_model_dir(tmp_path / "model")
    (tmp_path / "logs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(400, seed=1)))
    rows = texts(160, seed=2)
    (tmp_path / "test.jsonl").write_text("".join(
        json.dumps({"text": t, "label": "positive" if ("good" in t or "great" in t) else "negative"}) + "\n"
        for t in rows))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_the_examples_run_in_order_and_print_what_they_show(workspace: Path) -> None:
    globs: dict[str, object] = {"Path": Path}
    parser, failed = doctest.DocTestParser(), []
    for name in ORDER:
        fn = getattr(api, name)
        test = parser.get_doctest(fn.__doc__ or "", globs, f"ck.{name}", inspect.getsourcefile(fn), 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        out: list[str] = []
        runner.run(test, out=out.append, clear_globs=False)
        globs.update(test.globs)  # DocTest runs on a copy: what this example made, the next one uses
        if runner.failures:
            failed.append("".join(out))
    assert not failed, "\n".join(failed)
