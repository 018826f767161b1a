"""Every task kind by name (the one table: ``register`` adds a kind), and the task of a model: the kind asked
for (``--task``), else the first whose ``detect`` accepts the model's outputs and config.json, in the table's
order, else :data:`FALLBACK`.

The built-in kinds' rules exclude each other (a head whose config.json says it scores or takes independent
labels is that whatever its outputs are named; a ``logits`` output with a sequence axis is a token classifier,
without one a classifier; a classifier's ``logits`` win over encoder-named outputs beside them), so a kind
registered later is tried only where none of them applies. The table's order is also the order messages list
the kinds in.
"""

from __future__ import annotations

from collections.abc import Mapping

from calibkit.errors import ModelError
from calibkit.tasks.base import KindTraits, ModelFacts, Task
from calibkit.tasks.classification import ClassificationTask
from calibkit.tasks.embedding import EmbeddingTask
from calibkit.tasks.multi_label import MultiLabelTask
from calibkit.tasks.regression import RegressionTask
from calibkit.tasks.token_classification import TokenClassificationTask

TASKS: dict[str, type[KindTraits]] = {}
FALLBACK = EmbeddingTask.kind  # a model no kind detects is an encoder whose vectors are compared


def register(cls: type[KindTraits]) -> type[KindTraits]:
    """Add a task kind (a class with the :class:`~calibkit.tasks.base.KindTraits` class methods and the
    :class:`~calibkit.tasks.base.Task` instance methods) under its ``kind``; detection tries it after the
    kinds before it. Usable as a class decorator; a name already taken is refused."""
    name = cls.kind
    if name in TASKS:
        raise ValueError(f"task kind {name!r} is already registered ({TASKS[name].__qualname__})")
    TASKS[name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a task kind (tests restore the table with it)."""
    del TASKS[name]


for _kind in (ClassificationTask, EmbeddingTask, TokenClassificationTask, RegressionTask, MultiLabelTask):
    register(_kind)


def kind_names() -> tuple[str, ...]:
    return tuple(TASKS)


def per_text_kinds() -> tuple[str, ...]:
    """The kinds with one fidelity value per text (the ones tune and per-layer sensitivity can judge)."""
    return tuple(k for k, cls in TASKS.items() if cls.per_text)


def task_class(name: str) -> type[KindTraits]:
    """The task kind named ``name`` (ValueError naming the known ones otherwise)."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task kind {name!r} (known: {', '.join(TASKS)})") from None


def choose_task(
    outputs: Mapping[str, int | None],
    config: Mapping[str, object] | None = None,
    kind: str | None = None,
) -> Task:
    """The task for a model with these outputs (name -> rank, None when unknown) and config.json; ``kind``
    forces one (``--task``)."""
    from calibkit.data.modeldir import parse_id2label

    cfg = dict(config or {})
    id2label = parse_id2label(cfg.get("id2label"), "config.json")
    named = cfg.get("architectures")
    archs = " ".join(a for a in (named if isinstance(named, list) else []) if isinstance(a, str))
    if not outputs:
        raise ModelError("the model has no outputs")
    model = ModelFacts(dict(outputs), cfg, tuple(id2label[i] for i in sorted(id2label)), archs)
    if kind is not None:
        return task_class(str(kind)).for_model(model)
    found = next((cls for cls in TASKS.values() if cls.detect(model)), TASKS[FALLBACK])
    return found.for_model(model)


def model_outputs(model: object) -> dict[str, int | None]:
    """name -> rank of an ONNX model's graph outputs (None where the file does not say)."""
    out: dict[str, int | None] = {}
    for o in model.graph.output:  # type: ignore[attr-defined]
        tt = o.type.tensor_type
        out[o.name] = len(tt.shape.dim) if tt.HasField("shape") else None
    return out


def check_label_count(task: Task, model: object, label: str) -> None:
    """Refuse, before any inference, a model whose output has a fixed class axis of another size than the label
    names config.json gives the task (a config.json from another checkpoint): ``label`` names the model."""
    if not task.labels:
        return
    for o in model.graph.output:  # type: ignore[attr-defined]
        if o.name != task.output_name or not o.type.tensor_type.HasField("shape"):
            continue
        dims = o.type.tensor_type.shape.dim
        width = dims[-1].dim_value if len(dims) and dims[-1].HasField("dim_value") else 0
        if width and width != len(task.labels):
            raise ModelError(f"{label} returns {width} scores per text in {o.name!r} but its config.json names "
                             f"{len(task.labels)} labels (id2label)",
                             hint="use the config.json of the checkpoint the model was exported from")
