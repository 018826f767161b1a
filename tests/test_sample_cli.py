"""`calibkit sample` end to end through typer's CliRunner: outputs, manifest, reproducibility, errors."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.demo.traffic import SourceText, generate_log

runner = CliRunner()


def make_sources(n: int = 400, seed: int = 0) -> list[SourceText]:
    rng = random.Random(seed)
    vocab = {
        "movie": "film actor plot scene director sequel cinema cast".split(),
        "news": "senate budget court reform election tax minister vote".split(),
        "product": "battery charger refund delivery seller cable screen box".split(),
    }
    common = "the a is was great awful very not".split()
    out = []
    for i in range(n):
        kind = sorted(vocab)[i % 3]
        words = [rng.choice(vocab[kind] + common) for _ in range(rng.randint(3, 30))]
        out.append(SourceText(" ".join(words) + f" {i}.", kind, rng.choice(("pos", "neg"))))
    return out


@pytest.fixture(scope="module")
def log_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("logs") / "prod.jsonl"
    summary = generate_log(make_sources(), p, 5000, seed=1)
    return p, summary


def _run(*args: str):
    return runner.invoke(app, ["sample", *map(str, args)])


def _read(d):
    return (d / "texts.jsonl").read_bytes(), json.loads((d / "manifest.json").read_text())


def test_sample_writes_set_and_manifest(log_file, tmp_path):
    p, summary = log_file
    out = tmp_path / "set"
    r = _run(p, "--size", 64, "--out", out, "--label-field", "label")
    assert r.exit_code == 0, r.output
    assert "representative" in r.stdout and "text, request.text (auto-detected)" in r.stdout
    texts_raw, m = _read(out)
    rows = [json.loads(x) for x in texts_raw.decode().splitlines()]
    assert len(rows) == 64 == m["count"] and all(set(x) == {"text", "label"} for x in rows)
    assert len({x["text"] for x in rows}) == 64
    from calibkit.provenance import document_path

    assert document_path(out / "manifest.json", m["source"]["path"], m) == p  # relative to the manifest's folder
    assert m["source"]["size_bytes"] == p.stat().st_size
    import hashlib

    assert m["source"]["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    lines = m["lines"]
    assert lines["read"] == 5000 and lines["usable"] == summary.records
    assert lines["broken"]["blank"]["count"] == summary.broken["blank"]
    assert lines["broken"]["invalid_json"]["count"] == summary.broken["truncated_json"]
    assert lines["broken"]["invalid_utf8"]["count"] == summary.broken["invalid_utf8"]
    for kind in ("missing_text", "empty_text", "non_string_text"):
        assert lines["broken"][kind]["count"] == summary.broken[kind]
    assert len(lines["broken"]["blank"]["first_lines"]) <= 5
    assert m["redaction"]["counts"]["email"] == summary.emails
    assert m["redaction"]["counts"]["card"] == summary.cards
    assert m["redaction"]["counts"]["ip"] == summary.ips
    assert m["redaction"]["counts"]["phone"] == summary.phones
    assert m["cleanup"]["script_blocks_removed"] == summary.script_blocks
    assert not any("<script" in x["text"] or "@" in x["text"] for x in rows)
    dd = m["dedup"]
    assert dd["duplicate_lines"] >= summary.hot_query_lines - 5 and dd["hottest"][0]["seen"] > 20
    assert dd["distinct_texts"] + dd["duplicate_lines"] == summary.records
    assert sorted(m["sample_seen_counts"], reverse=True)[0] >= 1 and len(m["sample_seen_counts"]) == 64
    rep = m["representativeness"]
    assert rep["verdict"] in ("representative", "slightly shifted", "not representative")
    assert 0 <= rep["ks"] <= 1 and rep["psi"] >= 0
    assert sum(row["sample"] for row in m["strata"]["table"]) == 64
    assert set(m["strata"]["labels"]) == {"pos", "neg"}
    assert m["calibkit_version"] and m["seed"] == 0 and m["text_field"]["auto_detected"] is True
    assert m["length"]["over_max"]["sample"] == len(m["length"]["over_max"]["sample_indices"])


def test_byte_identical_rerun_and_seed_changes_sample(log_file, tmp_path):
    p, _ = log_file
    for name, seed in (("a", 0), ("b", 0), ("c", 5)):
        assert _run(p, "--size", 50, "--out", tmp_path / name, "--seed", seed).exit_code == 0
    a, b, c = (_read(tmp_path / n) for n in "abc")
    assert a[0] == b[0]
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    assert a[0] != c[0] and c[1]["seed"] == 5


def test_gzip_input_same_sample(log_file, tmp_path):
    p, _ = log_file
    gz = tmp_path / "prod.jsonl.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    assert _run(p, "--size", 40, "--out", tmp_path / "plain").exit_code == 0
    r = _run(gz, "--size", 40, "--out", tmp_path / "gz")
    assert r.exit_code == 0, r.output
    assert _read(tmp_path / "plain")[0] == _read(tmp_path / "gz")[0]
    assert _read(tmp_path / "gz")[1]["source"]["gzip"] is True


def test_no_redact_keeps_personal_data(tmp_path):
    p = tmp_path / "pii.jsonl"
    p.write_text("".join(json.dumps({"text": f"mail me {i} at a{i}@example.com"}) + "\n" for i in range(30)))
    r = _run(p, "--size", 30, "--out", tmp_path / "raw", "--no-redact")
    assert r.exit_code == 0, r.output
    texts, m = _read(tmp_path / "raw")
    assert texts.count(b"@example.com") == 30 and m["redaction"]["enabled"] is False
    assert _run(p, "--size", 1, "--out", tmp_path / "red").exit_code == 0
    texts, m = _read(tmp_path / "red")
    assert m["redaction"]["counts"]["email"] == 30 and b"<EMAIL>" in texts
    assert m["dedup"]["distinct_texts"] == 30  # "mail me {i}" keeps them distinct after redaction


def test_rare_length_bucket_and_rare_topic_represented(tmp_path):
    rng = random.Random(0)
    common = "battery charger refund delivery seller cable screen box great bad".split()
    rows = [" ".join(rng.choice(common) for _ in range(rng.randint(5, 12))) + f" {i}" for i in range(2000)]
    rare_topic = [f"senate election budget reform minister vote {i}" for i in range(20)]  # 1 %
    long_ones = [" ".join(f"word{j}" for j in range(700)) + f" {i}" for i in range(5)]  # 0.25 %
    allrows = rows + rare_topic + long_ones
    rng.shuffle(allrows)
    p = tmp_path / "rare.jsonl"
    p.write_text("".join(json.dumps({"query": t}) + "\n" for t in allrows))
    for seed in (0, 1, 2):
        r = _run(p, "--size", 40, "--out", tmp_path / f"s{seed}", "--seed", seed)
        assert r.exit_code == 0, r.output
        texts, m = _read(tmp_path / f"s{seed}")
        got = [json.loads(x)["text"] for x in texts.decode().splitlines()]
        assert any(t.startswith("senate election") for t in got), seed
        assert any(t.startswith("word0 word1") for t in got), seed
        assert m["length"]["over_max"]["sample"] >= 1 and m["length"]["over_max"]["population_estimated"] == 5
        assert m["text_field"]["paths"] == ["query"]


def test_tokenizer_option(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, "a": 2, "b": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tdir = tmp_path / "tok"
    tdir.mkdir()
    tok.save(str(tdir / "tokenizer.json"))
    (tdir / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8}))
    p = tmp_path / "log.jsonl"
    p.write_text("".join(json.dumps({"text": "a " * (i % 12 + 1) + f"z{i}"}) + "\n" for i in range(60)))
    r = _run(p, "--size", 60, "--out", tmp_path / "o", "--tokenizer", tdir)
    assert r.exit_code == 0, r.output
    _, m = _read(tmp_path / "o")
    assert m["length"]["max_length"] == 8 and m["length"]["measure"].startswith("tokenizer")
    # brute force: i % 12 + 2 whitespace tokens; longer than 8 when i % 12 + 2 > 8
    assert m["length"]["over_max"]["sample"] == sum(1 for i in range(60) if i % 12 + 2 > 8)


@pytest.mark.parametrize(
    "setup,args,message,code",
    [
        ("missing", [], "log not found", 3),
        ("dir", [], "not a file", 3),
        ("badgz", [], "corrupt gzip data", 3),
        ("empty", [], "log is empty", 3),
        ("junk", [], "no JSON object", 3),
        ("good", ["--text-field", "request.body"], "no usable text", 3),
        ("good", ["--size", "500"], "larger than the 20 distinct", 3),
        ("good", ["--strict"], ":4: invalid or truncated JSON", 3),
        ("good", ["--size", "0"], "at least 1", 2),  # a usage error, not a data one
    ],
)
def test_errors_exit_nonzero_and_write_nothing(tmp_path, setup, args, message, code):
    p = tmp_path / "log.jsonl"
    if setup == "dir":
        p.mkdir()
    elif setup == "badgz":
        p.write_bytes(gzip.compress(b'{"text": "a"}\n')[:10] + b"\xff" * 50)  # header, then an invalid block
    elif setup == "empty":
        p.write_bytes(b"")
    elif setup == "junk":
        p.write_bytes(b"hello\nworld\n")
    elif setup == "good":
        lines = [json.dumps({"text": f"request number {i}"}) for i in range(20)]
        lines.insert(3, '{"text": "trunc')
        p.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    r = _run(p, "--out", out, *args)
    assert r.exit_code == code, r.output
    assert message in " ".join(r.stderr.split()) and "Traceback" not in r.output
    assert not out.exists() and sorted(x.name for x in tmp_path.iterdir()) == (
        ["log.jsonl"] if setup != "missing" else []
    )


def test_default_out_dir(tmp_path, monkeypatch):
    p = tmp_path / "prod.jsonl.gz"
    p.write_bytes(gzip.compress(b"".join(json.dumps({"text": f"t {i}"}).encode() + b"\n" for i in range(10))))
    monkeypatch.chdir(tmp_path)
    assert _run(p, "--size", 5, "--seed", 3).exit_code == 0
    assert (tmp_path / "calibration_sets" / "prod-n5-s3" / "texts.jsonl").is_file()


def test_a_small_unrepresentative_sample_says_what_psi_means_and_what_to_do(log_file, tmp_path):
    r = _run(log_file[0], "--size", "32", "--out", tmp_path / "small")
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "not representative (PSI" in flat
    assert "population stability index" in flat and "--size 512" in flat and "--clusters" in flat
    r = _run(log_file[0], "--size", "512", "--out", tmp_path / "large")
    assert r.exit_code == 0 and "representative (PSI" in r.output and "population stability" not in r.output
