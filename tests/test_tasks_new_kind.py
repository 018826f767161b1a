"""A task kind added from outside the package: the worked example of docs/architecture.md (*Adding a task
kind*), run as written, registered, detected, and carried through compare and tune on a tiny model whose
output is one relevance score per text; the registry is restored after."""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_compare_tiny import NEG, POS, WORDS, compare_files, make_texts, make_tokenizer, table_for
from test_tune_pipeline import options, pooled_model, run_tune

from calibkit.data.calibset import write_calibration_set
from calibkit.data.modeldir import ModelDir
from calibkit.data.tokenizer import TextTokenizer
from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.graph import model_sha256
from calibkit.quantize.qdq import quantize_model, save_model
from calibkit.tasks import TASKS, choose_task, kind_names, register, task_class, unregister
from calibkit.types import Backend, Precision

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def doc_example() -> str:
    """The first Python block of the doc's *Adding a task kind* section."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Adding a task kind"):]
    section = section[:section.index("\n## ", 1)]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "the section has no Python example"
    return found.group(1)


@pytest.fixture()
def score_kind() -> Iterator[type]:
    """The doc's ScoreTask, registered with the doc's one line; the table is as it was afterwards."""
    before = dict(TASKS)
    module = types.ModuleType("doc_score_task")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(compile(doc_example(), str(DOC), "exec"), module.__dict__)
        register(module.ScoreTask)
        yield module.ScoreTask
    finally:
        if "score" in TASKS and "score" not in before:
            unregister("score")
        sys.modules.pop(module.__name__, None)
        assert TASKS == before and list(TASKS) == list(before)


def make_score_model() -> object:
    """ids -> Gather -> fc1 -> Relu -> fc2 -> mean over seq -> scorer: one score per text (positive words
    raise it, negative ones lower it), output ``score`` [batch, 1]."""
    rng = np.random.default_rng(0)
    h, vocab = 8, len(WORDS) + 4
    emb = (rng.standard_normal((vocab, h)) * 0.05).astype(np.float32)
    for w in POS:
        emb[WORDS.index(w) + 4, 0] = 3.0
    for w in NEG:
        emb[WORDS.index(w) + 4, 1] = 3.0
    w1 = np.eye(h, dtype=np.float32)
    w2 = np.eye(h, dtype=np.float32)
    w3 = np.zeros((h, 1), dtype=np.float32)
    w3[0, 0], w3[1, 0] = 1.0, -1.0
    return pooled_model(emb, w1, w2, w3, "tiny-scorer", head=("score", "scorer"))


def build_scorer(root: Path) -> dict[str, Path]:
    """The model folder (config.json says ``"problem_type": "score"``, no labels), its FP32 and INT8 engines, an
    eval set and a calibration set."""
    folder = root / "model"
    make_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps({"problem_type": "score"}))
    fp = make_score_model()
    save_model(fp, folder / "model.onnx")
    texts, labels = make_texts(300, seed=5)
    table = table_for(fp, texts[:60], TextTokenizer(folder), 1.0)
    (root / "calibration.json").write_text(json.dumps(table.to_dict()))
    save_model(quantize_model(fp, table).model, root / "int8.onnx")
    save_model(fp, root / "fp32.onnx")
    common = dict(backend=Backend.ONNXRUNTIME, source_model_sha256=model_sha256(folder / "model.onnx"),
                  tokenizer=str(folder), source_model=str(folder / "model.onnx"))
    EngineArtifact(path=root / "fp32.onnx", precision=Precision.FP32, **common).save()  # type: ignore[arg-type]
    EngineArtifact(path=root / "int8.onnx", precision=Precision.INT8, calibration_json=str(root / "calibration.json"),
                   **common).save()  # type: ignore[arg-type]
    write_calibration_set(root / "cset", texts[:60], None)
    (root / "eval.jsonl").write_text("".join(json.dumps({"text": t, "label": lab}) + "\n"
                                             for t, lab in zip(texts[60:], labels[60:])))
    return {"model": folder, "fp": root / "fp32.onnx", "int8": root / "int8.onnx", "eval": root / "eval.jsonl",
            "cset": root / "cset", "root": root}


def test_the_registered_kind_is_named_detected_and_refused_twice(score_kind: type) -> None:
    assert task_class("score") is score_kind and kind_names()[-1] == "score"
    task = choose_task({"score": 2}, {"problem_type": "score"})
    assert task.kind == "score" and task.output_name == "score" and task.per_text and task.tunable is None
    # the built-in kinds' choices are not changed by it
    assert choose_task({"score": 2}, {"id2label": {"0": "a", "1": "b"}}).kind == "classification"
    assert choose_task({"score": 2}, {"problem_type": "regression"}).kind == "regression"
    with pytest.raises(ValueError, match="already registered"):
        register(score_kind)
    rows = score_kind.row_fidelity(np.array([[1.0], [0.0], [2.0]]), np.array([[1.04], [0.2], [np.nan]]))
    assert rows.agreement.tolist() == [1.0, 0.0, 0.0]


def test_an_unregistered_kind_is_unknown() -> None:
    assert "score" not in kind_names()
    with pytest.raises(ValueError, match="unknown task kind 'score'"):
        task_class("score")


def test_compare_and_tune_run_on_the_new_kind(score_kind: type, tmp_path: Path) -> None:
    files = build_scorer(tmp_path)
    cmp = compare_files(files["fp"], files["int8"], files["eval"], batch_size=16, sensitivity=True,
                        sensitivity_samples=40)
    assert cmp.task.kind == "score" and cmp.task.output == "score"  # detected from config.json
    assert cmp.task.fidelity is not None and 0.0 <= cmp.task.fidelity.agreement <= 1.0
    assert cmp.sensitivity is not None and cmp.sensitivity.measured and cmp.sensitivity.task == "score"  # per text
    md = ModelDir.resolve(files["model"])
    res = run_tune(md, files["cset"], files["eval"], files["root"] / "tuned", options(task="score", method="minmax"))
    assert res.result.target.task == "score" and res.doc["target"]["task"] == "score"
    assert res.result.eval_set.labels == "none used: a score model is judged on fidelity to FP32"
    assert (files["root"] / "tuned" / "plan.json").is_file()
