"""Traffic evidence: unlabeled texts drawn from a log through sample's code path, calibration texts excluded."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from calibkit.data.calibset import write_calibration_set
from calibkit.data.dedup import digest, normalize
from calibkit.data.redact import redact
from calibkit.data.sample_pipeline import sample_log
from calibkit.data.sampling import length_bucket
from calibkit.errors import DataError
from calibkit.evaluate.traffic import (
    TrafficOptions,
    default_traffic_log,
    draw_default_traffic,
    draw_traffic,
    split_traffic,
)
from calibkit.progress import ProgressEvent
from calibkit.requests.sample import SampleRequest

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def _text(rng: random.Random, i: int) -> str:
    n = rng.choice((3, 5, 8, 12, 20, 30, 45, 70, 150))
    return f"req {i} " + " ".join(rng.choice(WORDS) for _ in range(n))


def _write_log(path: Path, texts: list[str], *, field: str = "text", extra_lines: tuple[str, ...] = ()) -> Path:
    lines = []
    for t in texts:
        rec: dict = {"request": {"text": t}} if field == "request.text" else {"text": t}
        lines.append(json.dumps(rec))
    lines.extend(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [_text(rng, i) for i in range(n)]


def test_excludes_calibration_texts_dedups_and_counts(tmp_path: Path) -> None:
    texts = _texts(600)
    calib = texts[:50]
    # the log repeats some texts, and writes calibration texts with other case and spacing
    log_texts = texts + texts[100:110] + [t.upper().replace(" ", "  ") for t in calib[:5]]
    log = _write_log(tmp_path / "log.jsonl", log_texts, extra_lines=("not json", "", '{"text": 3}'))
    cset = write_calibration_set(tmp_path / "cset", calib, None)
    ev = draw_traffic(log, TrafficOptions(size=200, seed=3), calibration_set=cset)
    assert len(ev) == ev.size_drawn == 200 and ev.size_requested == 200
    calib_keys = {digest(normalize(t)) for t in calib}
    assert not {digest(normalize(t)) for t in ev.texts} & calib_keys
    assert len(set(ev.keys)) == 200  # distinct
    assert ev.excluded["calibration_set"] == 50
    assert ev.excluded["calibration_set_lines"] == 55
    assert ev.excluded["duplicate_lines"] == 10
    assert ev.excluded["broken_lines"] == 3  # invalid JSON, blank, non-string text
    assert ev.population == 550
    assert ev.calibration_set_id == cset.id
    assert ev.source.sha256 and ev.source.text_fields == ("text",)
    lines = log.read_text().splitlines()
    for t, ln in zip(ev.texts, ev.line_numbers):
        assert json.loads(lines[ln - 1])["text"] == t
    d = ev.to_dict()
    assert d["keys"] == list(ev.keys) and d["content_sha256"] == ev.content_sha256 and "texts" not in d


def test_seeded_order_independent_and_stratified(tmp_path: Path) -> None:
    texts = _texts(3000, seed=1)
    a = draw_traffic(_write_log(tmp_path / "a.jsonl", texts), TrafficOptions(size=500, seed=0))
    shuffled = list(texts)
    random.Random(9).shuffle(shuffled)
    b = draw_traffic(_write_log(tmp_path / "b.jsonl", shuffled), TrafficOptions(size=500, seed=0))
    c = draw_traffic(tmp_path / "a.jsonl", TrafficOptions(size=500, seed=1))
    assert a.texts == b.texts and a.keys == b.keys and a.content_sha256 == b.content_sha256
    assert a.texts != c.texts and len(c) == 500
    # each length bucket's share of the draw follows its share of the log (proportional allocation)
    pop = {s.length_bucket: s.population for s in a.strata}
    drawn = {s.length_bucket: s.drawn for s in a.strata}
    assert sum(drawn.values()) == 500 and sum(pop.values()) == pytest.approx(3000)
    for k in pop:
        assert drawn[k] >= 1
        assert abs(drawn[k] - 500 * pop[k] / 3000) <= 2
    counted: dict[str, int] = {}
    from calibkit.data.sampling import bucket_names

    names = bucket_names()
    for n in a.lengths:
        counted[names[length_bucket(n)]] = counted.get(names[length_bucket(n)], 0) + 1
    assert counted == {k: v for k, v in drawn.items() if v}


def test_same_code_path_as_sample_field_redaction_strict(tmp_path: Path) -> None:
    texts = [f"ticket {i}: write to user{i}@example.com about the refund" for i in range(40)]
    texts += ["<script>var x = 1;</script>", "hello <script>alert(1)</script> world"]
    log = _write_log(tmp_path / "nested.jsonl", texts, field="request.text", extra_lines=("{broken",))
    ev = draw_traffic(log, TrafficOptions(size=100, text_field="request.text"))
    assert all("@example.com" not in t for t in ev.texts) and any("<EMAIL>" in t for t in ev.texts)
    assert ev.redaction.get("email") == 40
    assert ev.excluded["emptied_by_cleanup"] == 1 and "hello world" in ev.texts
    assert ev.source.text_fields == ("request.text",) and not ev.source.text_field_auto_detected
    assert len(ev) == 41 and ev.warnings and "drew 41 traffic texts of the 100 asked for" in ev.warnings[0]
    raw = draw_traffic(log, TrafficOptions(size=100, text_field="request.text", redact=False))
    assert any("@example.com" in t for t in raw.texts) and raw.redaction == {}
    auto = draw_traffic(log, TrafficOptions(size=100))  # auto-detected like sample
    assert auto.source.text_fields == ("request.text",) and auto.source.text_field_auto_detected
    with pytest.raises(DataError, match="--strict"):
        draw_traffic(log, TrafficOptions(size=10, text_field="request.text", strict=True))


def test_redacted_calibration_texts_are_excluded_either_way(tmp_path: Path) -> None:
    texts = [f"call me at alice{i}@example.org please, order {i}" for i in range(30)] + _texts(100)
    log = _write_log(tmp_path / "log.jsonl", texts)
    # a set sampled with redaction holds the redacted form; one sampled without it the raw form
    red = sample_log(SampleRequest(logs=log, out=tmp_path / "red", size=20, seed=0, clusters=1))
    raw = sample_log(SampleRequest(logs=log, out=tmp_path / "raw", size=20, seed=0, clusters=1, redact=False))
    for cset in (red, raw):
        ev = draw_traffic(log, TrafficOptions(size=1000), calibration_set=cset)
        assert ev.excluded["calibration_set"] == 20 and len(ev) == 110
        drawn = {digest(normalize(t)) for t in ev.texts}
        assert not drawn & {digest(normalize(redact(t).text)) for t in cset.texts}


def test_group_excluded_by_a_later_line_is_not_drawn(tmp_path: Path) -> None:
    # two raw texts that redact alike: the first is not in a --no-redact set, the second is; the group's
    # pooled member (from the first line) must not be drawn, since the set holds a text of that group
    a, b = "mail alice@example.org about it", "mail bob@example.net about it"
    log = _write_log(tmp_path / "log.jsonl", [a, b, *_texts(60)])
    cset = write_calibration_set(tmp_path / "cset", [b], None)
    ev = draw_traffic(log, TrafficOptions(size=1000), calibration_set=cset)
    assert redact(a).text not in ev.texts
    assert ev.excluded["calibration_set"] == 1 and len(ev) == 60
    assert sum(s.population for s in ev.strata) == pytest.approx(60)
    # a pool smaller than its stratum: the group's first line was counted when offered; taken back, the strata
    # still add up to the 60 distinct texts outside the set (61 or 48.8 before)
    few = draw_traffic(log, TrafficOptions(size=5), calibration_set=cset)
    assert redact(a).text not in few.texts and few.population == 60 and len(few) == 5
    assert sum(s.population for s in few.strata) == pytest.approx(60)


def test_default_log_from_the_manifest(tmp_path: Path) -> None:
    log = _write_log(tmp_path / "log.jsonl", _texts(400), field="request.text")
    cset = sample_log(SampleRequest(logs=log, out=tmp_path / "cset", size=64, clusters=1, text_field="request.text"))
    d = default_traffic_log(cset)
    assert d.path == log and d.text_field == "request.text" and d.redact
    events: list[ProgressEvent] = []
    ev = draw_default_traffic(cset, TrafficOptions(size=100), progress=events.append)
    assert len(ev) == 100 and ev.excluded["calibration_set"] == 64 and ev.source.text_fields == ("request.text",)
    assert events and events[-1].done == events[-1].total
    # the same bytes count: a log rewritten with another line of the same length is refused
    data = log.read_bytes()
    log.write_bytes(data.replace(b"req 1 ", b"req 7 ", 1))
    assert log.stat().st_size == len(data)
    with pytest.raises(DataError, match="changed") as exc:
        draw_default_traffic(cset, TrafficOptions(size=100))
    assert "--traffic" in (exc.value.hint or "")
    log.write_bytes(data + b'{"request": {"text": "one more"}}\n')
    with pytest.raises(DataError, match="changed"):
        default_traffic_log(cset)
    log.unlink()
    with pytest.raises(DataError, match="no longer there") as exc:
        default_traffic_log(cset)
    assert "--traffic" in (exc.value.hint or "")
    bare = write_calibration_set(tmp_path / "bare", ["a text"], None)
    with pytest.raises(DataError, match="names no source log"):
        default_traffic_log(bare)


def test_nothing_left_and_bad_size(tmp_path: Path) -> None:
    texts = _texts(20)
    log = _write_log(tmp_path / "log.jsonl", texts)
    cset = write_calibration_set(tmp_path / "c", texts, None)
    with pytest.raises(DataError, match="all 20 distinct texts are in the calibration set"):
        draw_traffic(log, TrafficOptions(size=5), calibration_set=cset)
    with pytest.raises(DataError, match="at least 1"):
        draw_traffic(log, TrafficOptions(size=0))


def test_split_is_seeded_disjoint_and_content_keyed(tmp_path: Path) -> None:
    texts = _texts(2000, seed=4)
    ev = draw_traffic(_write_log(tmp_path / "a.jsonl", texts), TrafficOptions(size=1000))
    sp = split_traffic(ev, 0.4, seed=0)
    assert len(sp.search) + len(sp.holdout) == 1000 and abs(len(sp.holdout) - 400) <= 7
    assert not set(sp.search.keys) & set(sp.holdout.keys)
    assert sp.search.part == "search" and sp.holdout.part == "holdout"
    assert sp.search.texts == tuple(ev.texts[i] for i in sp.search_subset.indices)
    again = split_traffic(ev, 0.4, seed=0)
    other = split_traffic(ev, 0.4, seed=1)
    assert again.holdout.keys == sp.holdout.keys and other.holdout.keys != sp.holdout.keys
    # stratified by length bucket: each bucket is split in the same proportion
    for b in {length_bucket(n) for n in ev.lengths}:
        total = sum(1 for n in ev.lengths if length_bucket(n) == b)
        held = sum(1 for n in sp.holdout.lengths if length_bucket(n) == b)
        assert held == round(total * 0.4)


def test_twenty_thousand_lines_draw_four_thousand_in_seconds(tmp_path: Path) -> None:
    rng = random.Random(5)
    texts = [_text(rng, i) for i in range(20_000)]
    log = _write_log(tmp_path / "big.jsonl", texts)
    cset = write_calibration_set(tmp_path / "c", texts[:512], None)
    t = time.perf_counter()
    ev = draw_traffic(log, TrafficOptions(size=4000), calibration_set=cset)
    took = time.perf_counter() - t
    assert len(ev) == 4000 and ev.excluded["calibration_set"] == 512
    assert took < 10.0, f"drawing took {took:.1f} s"


def test_exact_lengths_with_a_tokenizer(tmp_path: Path) -> None:
    from calib_helpers import write_model_dir

    model = write_model_dir(tmp_path / "model", max_positions=16)
    texts = [" ".join(["good movie"] * n) + f" {i}" for i, n in enumerate((1, 2, 3, 5, 8, 12) * 10)]
    ev = draw_traffic(_write_log(tmp_path / "log.jsonl", texts), TrafficOptions(size=30, tokenizer=model))
    assert ev.length_measure.startswith("tokenizer") and len(ev) == 30
    from calibkit.data.tokenizer import TextTokenizer

    tok = TextTokenizer(model)
    assert list(ev.lengths) == [int(n) for n in tok.token_lengths(list(ev.texts))]
    assert any("longer than 16 tokens" in w for w in ev.warnings)


def test_gzip_log_gives_the_same_draw(tmp_path: Path) -> None:
    import gzip

    plain = _write_log(tmp_path / "log.jsonl", _texts(500, seed=6))
    gz = tmp_path / "log.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    a = draw_traffic(plain, TrafficOptions(size=100))
    b = draw_traffic(gz, TrafficOptions(size=100))
    assert a.keys == b.keys and b.source.gzip and not a.source.gzip and a.source.sha256 != b.source.sha256


def test_fewer_texts_than_asked_are_warned_about_with_why_and_what_it_costs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """tune's --traffic-size met a smaller log: the warning names asked, drawn, why and what the holdout gets."""
    import logging

    from calib_helpers import texts as model_texts
    from calib_helpers import write_model_dir

    from calibkit.evaluate.inputs import resolve_tune
    from calibkit.requests.tune import TuneRequest

    model = write_model_dir(tmp_path / "model")
    distinct = list(dict.fromkeys(model_texts(600, seed=4)))[:200]  # words the tiny model's tokenizer knows
    log = _write_log(tmp_path / "log.jsonl", distinct + distinct[100:150])  # 50 duplicate lines
    cset = write_calibration_set(tmp_path / "set", distinct[:30], None)
    request = TuneRequest(model=model, calibration_set=cset.path, traffic=log, traffic_size=1000,
                          out=tmp_path / "tune")
    with caplog.at_level(logging.WARNING, logger="calibkit"):
        inputs = resolve_tune(request)
    drawn = len(inputs.traffic)
    assert drawn < 1000
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "traffic texts" in
            r.getMessage()]
    assert len(said) == 1, caplog.text
    w = said[0]
    assert f"drew {drawn:,} traffic texts of the 1,000 asked for" in w
    x = inputs.traffic.excluded
    assert x["calibration_set"] >= 30 and x["duplicate_lines"] >= 1
    assert "250 lines" in w and f"{x['duplicate_lines']:,} duplicates of earlier lines" in w
    assert f"{x['calibration_set']:,} distinct texts of the calibration set excluded" in w
    assert f"{1000 ** 0.5 / drawn ** 0.5:.1f}x as wide" in w
    half = request.holdout_fraction
    assert (f"holdout (--holdout {half:g}) gets about {round(drawn * half):,} of them instead of "
            f"{round(1000 * half):,}") in w
    assert inputs.traffic.warnings and inputs.traffic.warnings[0].startswith(f"drew {drawn:,}")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="calibkit"):
        resolve_tune(TuneRequest(model=model, calibration_set=cset.path, traffic=log, traffic_size=100,
                                 out=tmp_path / "tune"))
    assert not [r for r in caplog.records if "traffic texts" in r.getMessage()], "as many as asked: nothing said"
