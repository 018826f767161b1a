"""perf_analyzer input data made of real traffic texts, so a load test replays production lengths.

Format (perf_analyzer's "Real Input Data", ``--input-data FILE.json``)::

    {"data": [{"input_ids": {"content": [101, 2023, ...], "shape": [16]},
               "attention_mask": {"content": [1, 1, ..., 0], "shape": [16]}}, ...]}

one entry per request, in the order perf_analyzer cycles through them; ``shape`` leaves out the batch axis
(the model batches) and is given per entry because the sequence axis varies. Each text is tokenized with the
model's tokenizer, truncated to the largest profile max, and padded to its bucket's length, as a client
following this configuration sends it (Triton batches only requests of equal shape): the load test then sees
the bucket mix and the batch formation of production.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from calibkit.deploy.profiles import BucketChoice

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.tokenizer import TextTokenizer


@dataclass(frozen=True)
class PerfData:
    doc: dict[str, Any]
    requests: int
    per_bucket: tuple[int, ...]  # requests of each bucket


def padded_feeds(tok: TextTokenizer, text: str, width: int, max_seq: int,
                 input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """The feeds of one request: ``text`` tokenized (cut to ``max_seq``), padded to ``width`` tokens, [1, width]."""
    from calibkit.data.tokenizer import Encoding

    enc = tok.encode([text], max_length=max_seq)
    n = int(enc.lengths[0])
    ids = np.full((1, width), tok.pad_id, dtype=np.int64)
    mask = np.zeros((1, width), dtype=np.int64)
    types = np.zeros((1, width), dtype=np.int64)
    ids[0, :n] = enc.input_ids[0, :n]
    mask[0, :n] = 1
    types[0, :n] = enc.token_type_ids[0, :n]
    padded = Encoding(ids, mask, types, np.array([n], dtype=np.int64), enc.truncated)
    return padded.feeds(input_names)


def build_perf_data(tok: TextTokenizer, texts: Sequence[str], lengths: Sequence[int], choice: BucketChoice,
                    input_names: Sequence[str]) -> PerfData:
    """perf_analyzer's JSON for ``texts`` (``lengths``: their untruncated token counts)."""
    entries = []
    counts = [0] * choice.k
    for text, length in zip(texts, lengths):
        b = choice.bucket_of(int(length))
        counts[choice.buckets.index(b)] += 1
        feeds = padded_feeds(tok, text, b.hi, choice.max_seq, input_names)
        entries.append({name: {"content": [int(v) for v in arr[0]], "shape": [int(arr.shape[1])]}
                        for name, arr in feeds.items()})
    return PerfData({"data": entries}, len(entries), tuple(counts))


def perf_analyzer_command(model: str, data_file: str, *, max_batch: int, url: str = "localhost:8001") -> list[str]:
    """Requests of batch 1 (as clients send them; Triton batches them), concurrency swept to 2x max batch."""
    top = max(2, 2 * max_batch)
    return ["perf_analyzer", "-m", model, "-i", "grpc", "-u", url, f"--input-data={data_file}",
            f"--concurrency-range=1:{top}:{max(1, top // 8)}", "--percentile=95"]


def render(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
