"""`calibkit export`: tiny random-initialised transformers saved as users save theirs (save_pretrained,
SentenceTransformer.save, an ONNX file), exported to a model folder and taken through sample and calibrate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.errors import ModelError

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
transformers = pytest.importorskip("transformers")

import zoo  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                        "ignore::UserWarning")


def _run(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, [str(a) for a in args])


def _checkpoint(folder: Path, head: str, *, safetensors: bool = True, problem_type: str | None = None) -> Path:
    """A 2-layer BERT with ``head`` ("classification", "token-classification", "masked-lm", "encoder") and a
    tokenizer learnt from the zoo's texts, saved with save_pretrained."""
    special = zoo._train_tokenizer(folder, zoo.zoo_texts(100, seed=1), "bert")
    config = zoo._config("bert", "embedding" if head in ("masked-lm", "encoder") else head, special)
    if problem_type:
        config.problem_type = problem_type
    torch.manual_seed(0)
    cls = {"classification": transformers.BertForSequenceClassification,
           "token-classification": transformers.BertForTokenClassification,
           "masked-lm": transformers.BertForMaskedLM, "encoder": transformers.BertModel}[head]
    model = cls(config).eval()
    model.save_pretrained(str(folder))
    if not safetensors:  # the older PyTorch pickle, as checkpoints saved before safetensors hold it
        (folder / "model.safetensors").unlink()
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder


def _metadata(path: Path) -> dict:
    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    return json.loads(props["calibkit.export"])


def _dynamic(path: Path) -> bool:
    m = onnx.load(str(path), load_external_data=False)
    return all(len(i.type.tensor_type.shape.dim) == 2 and not any(d.HasField("dim_value")
                                                                    for d in i.type.tensor_type.shape.dim)
               for i in m.graph.input)


def test_a_hugging_face_classifier_exported_then_sampled_and_calibrated(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    src = _checkpoint(tmp_path / "hf", "classification")
    r = _run("export", src, "--out", tmp_path / "model")
    assert r.exit_code == 0, r.output
    assert "as a classification model" in r.output and "largest difference" in r.output
    out = tmp_path / "model"
    assert {"model.onnx", "tokenizer.json", "config.json"} <= {p.name for p in out.iterdir()}
    meta = _metadata(out / "model.onnx")
    assert meta["task"] == "classification" and meta["output"] == "logits"
    assert meta["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert meta["parity"]["relative"] < 1e-4 and _dynamic(out / "model.onnx")
    logs = zoo.write_texts(tmp_path / "logs.jsonl", zoo.zoo_texts(80, seed=3))
    r = _run("sample", logs, "--size", "24", "--tokenizer", out, "--out", tmp_path / "set")
    assert r.exit_code == 0, r.output
    r = _run("calibrate", out, "-c", tmp_path / "set", "--method", "minmax", "--out", tmp_path / "cal")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cal" / "model.int8.onnx").is_file()


def test_past_the_tolerance_nothing_is_written(tmp_path: Path) -> None:
    """The parity check refuses: a tolerance below float rounding is always exceeded."""
    src = _checkpoint(tmp_path / "hf", "classification")
    r = _run("export", src, "--out", tmp_path / "model", "--tolerance", "1e-12")
    assert r.exit_code == 4, r.output
    assert "differ from the source's by up to" in r.output and "nothing was written" in r.output
    assert not (tmp_path / "model").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.")]


def test_token_classifier_from_pytorch_weights(tmp_path: Path) -> None:
    import calibkit as ck

    src = _checkpoint(tmp_path / "hf", "token-classification", safetensors=False)
    assert (src / "pytorch_model.bin").is_file()
    result = ck.export(src, tmp_path / "model")
    assert result.task == "token-classification" and result.parity is not None
    assert result.parity.relative < 1e-4 and _metadata(result.model_path)["task"] == "token-classification"


def test_any_head_exports_its_encoder_with_task_embedding(tmp_path: Path) -> None:
    import calibkit as ck

    src = _checkpoint(tmp_path / "hf", "masked-lm")
    with pytest.raises(ModelError, match="BertForMaskedLM, a head calibkit does not judge"):
        ck.export(src, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    result = ck.export(src, tmp_path / "model", task="embedding")
    assert result.task == "embedding" and result.output == "last_hidden_state" and result.head == "encoder"


def test_a_forced_regression_is_recorded_in_config(tmp_path: Path) -> None:
    import calibkit as ck

    src = _checkpoint(tmp_path / "hf", "classification")
    result = ck.export(src, tmp_path / "model", task="regression")
    assert result.task == "regression"
    assert json.loads((tmp_path / "model" / "config.json").read_text())["problem_type"] == "regression"


def test_sentence_transformers_pooling_matches_its_encode(tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    import calibkit as ck
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.enginefiles.registry import model_runner

    try:
        from sentence_transformers.sentence_transformer import modules
    except ImportError:  # before sentence-transformers 6
        from sentence_transformers import models as modules

    bert = _checkpoint(tmp_path / "bert", "encoder")
    model = st.SentenceTransformer(modules=[modules.Transformer(str(bert)),
                                            modules.Pooling(zoo.HIDDEN, pooling_mode="mean"),
                                            modules.Normalize()], device="cpu")
    model.save(str(tmp_path / "st"))
    result = ck.export(tmp_path / "st", tmp_path / "model")
    assert result.task == "embedding" and result.output == "sentence_embedding"
    assert result.source.pooling == "mean" and result.source.normalize
    texts = zoo.zoo_texts(12, seed=7)
    tok = TextTokenizer(tmp_path / "model")
    feeds = tok.encode(texts).feeds(list(result.inputs))
    with model_runner(result.model_path, output_names=["sentence_embedding"]) as runner:
        got = runner.infer(feeds)["sentence_embedding"]
    want = model.encode(texts, convert_to_numpy=True, batch_size=len(texts))
    assert np.abs(got - want).max() < 1e-4


def test_an_onnx_file_with_fixed_axes_is_refused(tmp_path: Path) -> None:
    from calib_helpers import tiny_model, write_tokenizer

    import calibkit as ck

    folder = tmp_path / "src"
    folder.mkdir()
    write_tokenizer(folder)
    m = tiny_model()
    onnx.save(m, str(folder / "dynamic.onnx"))
    result = ck.export(folder / "dynamic.onnx", tmp_path / "copied")
    assert result.parity is None and result.task == "classification" and _dynamic(result.model_path)
    for inp in m.graph.input:
        for d, v in zip(inp.type.tensor_type.shape.dim, (1, 16)):
            d.ClearField("dim_param")
            d.dim_value = v
    onnx.save(m, str(folder / "fixed.onnx"))
    with pytest.raises(ModelError, match="has a fixed batch 1 and sequence 16"):
        ck.export(folder / "fixed.onnx", tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def _st_folder(root: Path, pooling: dict, extra: tuple[str, ...] = ()) -> Path:
    """A sentence-transformers folder as versions before 6 wrote it (pooling_mode_* booleans)."""
    (root / "1_Pooling").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(b"")
    (root / "vocab.txt").write_text("[PAD]\n")
    (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    types = ["Transformer", "Pooling", *extra]
    (root / "modules.json").write_text(json.dumps([{"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_{t}",
                                                    "type": f"sentence_transformers.models.{t}"}
                                                   for i, t in enumerate(types)]))
    return root


def test_sentence_transformers_folders_of_earlier_versions(tmp_path: Path) -> None:
    from calibkit.exporter import SourceKind, resolve_source

    src = resolve_source(_st_folder(tmp_path / "a", {"pooling_mode_cls_token": True,
                                                     "pooling_mode_mean_tokens": False}, ("Normalize",)))
    assert (src.kind, src.pooling, src.normalize) == (SourceKind.SENTENCE_TRANSFORMERS, "cls", True)
    with pytest.raises(ModelError, match=r"modules \['Transformer', 'Pooling', 'Dense'\].*\(not Dense\)"):
        resolve_source(_st_folder(tmp_path / "b", {"pooling_mode_mean_tokens": True}, ("Dense",)))
    with pytest.raises(ModelError, match="pooling pooling_mode_weightedmean_tokens"):
        resolve_source(_st_folder(tmp_path / "c", {"pooling_mode_weightedmean_tokens": True}))


def test_the_summary_line_reads_as_english_for_an_embedding_model(tmp_path: Path) -> None:
    r = _run("export", _checkpoint(tmp_path / "hf", "encoder"), "--out", tmp_path / "model")
    assert r.exit_code == 0, r.output
    assert "as an embedding model: inputs" in " ".join(r.output.split())
