"""The vaderSentiment archive: parsing, labels, the seeded split, and download failures."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from calibkit.demo import archive
from calibkit.errors import DataError, MissingDependencyError


def _gt(rows: list[tuple[str, str, str]]) -> bytes:
    return "".join(f"{i}\t{r}\t{t}\r\n" for i, r, t in rows).encode()


def test_parse_labels_by_sign_and_drops_zeros() -> None:
    data = _gt([("1", "2.5", "great"), ("2", "-0.1", "meh &amp; bad"), ("3", "0", "neutral"), ("4", "0.0", "x")])
    corpus = archive.parse_ground_truth("tweet", data)
    assert [(t.id, t.label) for t in corpus.texts] == [("1", "positive"), ("2", "negative")]
    assert corpus.dropped_zero == 2
    assert corpus.texts[1].text == "meh & bad"  # HTML entities of the tweets are decoded, CRLF stripped
    assert corpus.texts[1].rating == pytest.approx(-0.1)


def test_parse_rejects_malformed_lines() -> None:
    with pytest.raises(DataError, match="line 2"):
        archive.parse_ground_truth("movie", b"1\t1.0\tfine\nbroken line without tabs\n")
    with pytest.raises(DataError, match="not a number"):
        archive.parse_ground_truth("movie", b"1\tabc\ttext\n")


def _texts(n: int) -> list[archive.LabelledText]:
    return [archive.LabelledText(str(i), f"t{i}", 1.0, "positive", "movie") for i in range(n)]


def test_split_is_seeded_disjoint_and_complete() -> None:
    texts = _texts(1000)
    a = archive.split_movies(texts, seed=0)
    b = archive.split_movies(texts, seed=0)
    c = archive.split_movies(texts, seed=1)
    assert a == b
    assert {t.id for t in a.test} != {t.id for t in c.test}
    assert len(a.test) == 200 and len(a.train) == 800
    assert {t.id for t in a.train}.isdisjoint({t.id for t in a.test})
    assert {t.id for t in a.train} | {t.id for t in a.test} == {t.id for t in texts}


def test_cached_archive_is_reused_without_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "downloads" / archive.ARCHIVE_NAME
    target.parent.mkdir(parents=True)
    target.write_bytes(b"pretend archive")
    monkeypatch.setattr(archive, "ARCHIVE_SHA256", hashlib.sha256(b"pretend archive").hexdigest())
    monkeypatch.setattr(archive.subprocess, "run", lambda *a, **k: pytest.fail("must not download"))
    assert archive.fetch_archive(tmp_path) == target


def test_failed_download_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(archive.subprocess, "run", fake_run)
    with pytest.raises(MissingDependencyError, match="network unreachable") as info:
        archive.fetch_archive(tmp_path)
    assert info.value.hint and "CALIBKIT_CACHE" in info.value.hint
    assert not (tmp_path / "downloads" / archive.ARCHIVE_NAME).exists()


def test_wrong_hash_is_rejected_and_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        (Path(cmd[cmd.index("-d") + 1]) / archive.ARCHIVE_NAME).write_bytes(b"tampered")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(archive.subprocess, "run", fake_run)
    with pytest.raises(DataError, match="sha256"):
        archive.fetch_archive(tmp_path)
    assert not (tmp_path / "downloads" / archive.ARCHIVE_NAME).exists()
    assert list((tmp_path / "downloads").iterdir()) == []
