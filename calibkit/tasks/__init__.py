"""What a model's outputs mean: one module per task kind, one registry (:mod:`calibkit.tasks.registry`).

compare and tune ask the task, never the model type: ``classification``, ``embedding``,
``token-classification``, ``regression`` and ``multi-label`` are the kinds calibkit ships; a new kind is its
module and one :func:`register` call (see docs/architecture.md, *Adding a task kind*).
"""

from __future__ import annotations

from calibkit.tasks.base import (
    EMBEDDING_OUTPUTS,
    SEQUENCE_OUTPUTS,
    EngineScore,
    KindTraits,
    ModelFacts,
    Task,
    TaskScore,
    is_multi_label,
    is_regression,
    unscored_warnings,
)
from calibkit.tasks.classification import ClassificationTask
from calibkit.tasks.embedding import (
    RETRIEVAL_K,
    EmbeddingTask,
    NeighbourAgreement,
    nearest_neighbour_agreement,
    retrieval_agreement,
)
from calibkit.tasks.multi_label import MultiLabelTask, multi_hot
from calibkit.tasks.registry import (
    TASKS,
    check_label_count,
    choose_task,
    kind_names,
    model_outputs,
    per_text_kinds,
    register,
    task_class,
    unregister,
)
from calibkit.tasks.regression import REGRESSION_TOLERANCE, RegressionTask, numeric_labels
from calibkit.tasks.token_classification import (
    EntityScore,
    TokenClassificationTask,
    TokenGoldMetrics,
    WordGold,
    align_word_labels,
    bio_entities,
    entity_f1,
    entity_scores,
    first_token_positions,
)

__all__ = [
    "check_label_count",
    "EMBEDDING_OUTPUTS", "REGRESSION_TOLERANCE", "RETRIEVAL_K", "SEQUENCE_OUTPUTS", "TASKS", "ClassificationTask",
    "EmbeddingTask", "EngineScore", "EntityScore", "KindTraits", "ModelFacts", "MultiLabelTask",
    "NeighbourAgreement", "RegressionTask", "Task", "TaskScore", "TokenClassificationTask", "TokenGoldMetrics",
    "WordGold", "align_word_labels", "bio_entities", "choose_task", "entity_f1", "entity_scores",
    "first_token_positions", "is_multi_label", "is_regression", "kind_names", "model_outputs", "multi_hot",
    "nearest_neighbour_agreement", "numeric_labels", "per_text_kinds", "register", "retrieval_agreement", "task_class",
    "unregister", "unscored_warnings",
]
