"""Time up front: the estimate's arithmetic on fake timings, the estimate event before compare's and tune's long
part, the estimate and the actual time in their results, documents and reports, and the line the CLI prints."""

from __future__ import annotations

import io
import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from test_results import _random
from test_tune_pipeline import options, run_tune, tiny_setup  # noqa: F401 - tiny_setup is a fixture

from calibkit.cli import _common
from calibkit.data.evalset import load_eval_set
from calibkit.data.modeldir import ModelDir
from calibkit.errors import DataError
from calibkit.evaluate.estimate import (
    COSTS,
    MIN_SAVING,
    SPREAD,
    WORTH_SHORTENING,
    CompareSize,
    TuneSize,
    Work,
    estimate,
    finish,
    price,
    summary,
    tune_shortcuts,
    tune_steps,
)
from calibkit.progress import ESTIMATE_TASK, ProgressEvent
from calibkit.results import runs as R
from calibkit.results.codec import check_domains, parse_result, to_document
from calibkit.results.runs import FP32_PHASE, PhaseCost, TimeEstimate, span_text

# ---------------------------------------------------------------- the arithmetic, on fake timings


def test_each_kind_of_text_is_priced_by_its_cost_and_the_range_spreads_around_it() -> None:
    steps = [Work("fp32", fp32=100), Work("variants", qdq=200, qdq_worst=400), Work("taps", taps=50)]
    ts = 0.01
    priced = price(steps, ts)
    assert [s.step for s in priced] == ["fp32", "variants", "taps"]
    for s, (kind, n) in zip(priced, [("fp32", 100), ("qdq", 200), ("taps", 50)]):  # the likely count, priced
        assert s.likely_seconds == pytest.approx(ts * n * COSTS[kind] / SPREAD)
        assert s.worst_seconds == pytest.approx(ts * n * COSTS[kind] * SPREAD)
    e = estimate(steps, ts, 64)
    assert e.likely_seconds == pytest.approx(sum(s.likely_seconds for s in priced))
    assert e.worst_seconds == pytest.approx(sum(s.worst_seconds for s in priced))
    assert e.likely_seconds < e.worst_seconds and e.measured_texts == 64 and e.actual_seconds is None
    # remote workers spread the executor's Q/DQ texts; the driver's own steps are not spread
    spread = price([Work("v", qdq=200), Work("driver", qdq=200, on_executor=False)], ts, lanes=4.0)
    assert spread[0].likely_seconds == pytest.approx(priced[1].likely_seconds / 4)
    assert spread[1].likely_seconds == pytest.approx(priced[1].likely_seconds)
    with pytest.raises(ValueError, match="text_seconds"):
        estimate(steps, float("nan"), 64)


def test_only_remote_workers_spread_the_work_beyond_this_machine() -> None:
    from types import SimpleNamespace

    from calibkit.cpus import usable_cpus
    from calibkit.evaluate.estimate import lanes_of
    from calibkit.executors import from_spec

    with from_spec("inline", 1) as inline:
        assert lanes_of(inline) == 1.0
    cpus = usable_cpus()
    remote = SimpleNamespace(name="dask tcp://scheduler:8786", workers=8 * cpus, task_threads=2)
    assert lanes_of(remote) == pytest.approx(16.0)
    assert lanes_of(SimpleNamespace(name="dask-local:8", workers=8 * cpus, task_threads=1)) == 1.0


def test_the_shortcut_named_is_the_option_that_saves_the_most() -> None:
    steps = [Work("search", qdq=10_000), Work("rest", fp32=2_000)]
    ts = 0.01  # likely about 240 s: worth shortening
    options = {
        "--small-saving 1": [Work("search", qdq=10_000 * (1 - MIN_SAVING / 2)), Work("rest", fp32=2_000)],
        "--half 2": [Work("search", qdq=5_000), Work("rest", fp32=2_000)],
        "--most 3": [Work("search", qdq=2_000), Work("rest", fp32=2_000)],
    }
    e = estimate(steps, ts, 64, shortcuts=options)
    assert e.likely_seconds >= WORTH_SHORTENING
    assert e.shortcut is not None and e.shortcut.option == "--most 3"
    most = price(options["--most 3"], ts)
    assert e.shortcut.likely_seconds == pytest.approx(sum(s.likely_seconds for s in most))
    assert e.shortcut.worst_seconds == pytest.approx(sum(s.worst_seconds for s in most))
    line = summary(e, "tune")
    assert line.startswith("tune will take about ") and "--most 3 shortens it to about" in line
    # a saving under MIN_SAVING is not worth naming; nor is any option for a run of seconds
    assert estimate(steps, ts, 64, shortcuts={"--small-saving 1": options["--small-saving 1"]}).shortcut is None
    assert estimate(steps, ts / 100, 64, shortcuts=options).shortcut is None


def test_durations_read_as_a_person_reads_an_estimate() -> None:
    assert span_text(240, 420) == "4-7 min"
    assert span_text(50, 130) == "50 s to 2 min"
    assert span_text(5400, 9000) == "1.5-2.5 h"
    assert span_text(61, 61.4) == "61 s"


def test_the_measurement_is_scaled_to_the_padding_of_the_runs_own_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake model whose time is its padded tokens (a fake clock): two random batches pad more than the run's
    length-sorted batches, and the per-token price scaled to the run's padding is exact."""
    import calibkit.evaluate.estimate as E

    rng = np.random.default_rng(3)
    texts = [" ".join(["w"] * int(k)) for k in rng.integers(3, 120, size=500)]
    clock = [0.0]
    monkeypatch.setattr(E.time, "perf_counter", lambda: clock[0])

    def count(xs):
        return np.array([len(x.split()) for x in xs])

    def predict(xs):
        clock[0] += 1e-4 * E.padded_tokens(count(xs), 32)

    raw, n = E.measure_text_seconds(predict, texts, batch_size=32, seed=1)
    scaled, m = E.measure_text_seconds(predict, texts, batch_size=32, seed=1, lengths=count)
    assert n == m == E.MEASURE_TEXTS
    run = 1e-4 * E.padded_tokens(count(texts), 32) / len(texts)  # what the whole run costs a text
    assert scaled == pytest.approx(run)
    assert raw > 1.2 * run  # unscaled, the sample's padding would overprice every text
    assert E.measure_text_seconds(predict, [], batch_size=32) == (0.0, 0)


# the demo classifier with every default, as tune counted it (docs/measured.md, "The demo classifier with every
# default, on the 2-core machine"): 11,557 evidence texts, search split 5,778, holdout 5,779, 49 nodes, 512
# calibration texts, sensitivity subset 128, 1,363 texts a candidate, 40 evaluations; its phases took 83 s
# (FP32 reference) and 2,511 s in all
DEMO = TuneSize(search=5778, holdout=5779, sensitivity=128, nodes=49, ranked=49, methods=4, variants=2,
                auto_texts=2 * 64 * 49, race=512, calibration=512, candidate_share=(1363 / 5778, 1.5 * 1363 / 5778),
                max_evaluations=40, search_traffic=5250, holdout_traffic=5250)


def test_the_steps_count_the_texts_tune_counted_on_the_demo() -> None:
    steps = {w.step: w for w in tune_steps(DEMO)}
    assert steps["method tables"].qdq == 10_880  # "9 raced on 512 risky texts, auto": 10,880 texts
    assert steps["layer ranking"].qdq == 6_400  # 49 nodes and all-INT8 on 128 texts (more than auto's 64: no reuse)
    reused = {w.step: w for w in tune_steps(replace(DEMO, sensitivity=64))}["layer ranking"]
    assert reused.qdq < 64 * 50 / 2 < reused.texts(1)["qdq"]  # auto's one-node runs serve most of the ranking
    assert steps["flip risk"].qdq == 5_778
    # that run's unbounded prune measured 39 candidates (51,794 texts); the bounded one 12 (the device run of
    # docs/measured.md): the ladder and bisection over 49 nodes, all-INT8 and two prunes are priced
    assert steps["plan search"].qdq == pytest.approx(14 * 1363)
    assert steps["plan search"].texts(1)["qdq"] == pytest.approx(40 * 1.5 * 1363)
    # the run of the same command with the bounded prune (docs/measured.md): 663 s, its FP32 pass 101 s
    e = estimate(tune_steps(DEMO), 101 / 11_557, 11_557, shortcuts=tune_shortcuts(DEMO))
    assert e.likely_seconds <= 663 - 101 <= e.worst_seconds  # what the phases after the FP32 reference took
    # the traffic is most of the evidence: halving it saves the most
    assert e.shortcut is not None and e.shortcut.option == "--traffic-size 5250"
    savings = {o: sum(s.likely_seconds for s in price(w, e.text_seconds)) for o, w in tune_shortcuts(DEMO).items()}
    assert e.shortcut.likely_seconds == pytest.approx(min(savings.values()))
    assert {"--max-evaluations 20", "--method minmax", "--no-smooth", "--sensitivity-samples 64"} <= set(savings)
    assert not any(o.startswith("--limit") for o in savings)  # 57 labelled rows: not where the time goes


def test_finish_records_the_whole_and_each_timed_step() -> None:
    e = estimate([Work("a", fp32=10), Work("b", fp32=10), Work("untimed", fp32=1)], 0.1, 8)
    done = finish(e, 7.5, [PhaseCost(FP32_PHASE, 1.0, 8), PhaseCost("a", 2.0), PhaseCost("b", 1.5),
                           PhaseCost("b", 0.5)])
    assert done.actual_seconds == 7.5
    assert [s.actual_seconds for s in done.steps] == [2.0, 2.0, None]  # a step timed twice: both
    assert [s.likely_seconds for s in done.steps] == [s.likely_seconds for s in e.steps]


# ---------------------------------------------------------------- end to end


def _tasks_in_order(events: list[ProgressEvent]) -> list[str]:
    out: list[str] = []
    for ev in events:
        if not out or out[-1] != ev.task:
            out.append(ev.task)
    return out


def test_tune_announces_its_estimate_after_the_fp32_pass_and_records_it_with_the_actual_time(tiny_setup):  # noqa: F811
    events: list[ProgressEvent] = []
    cfg = options(max_drop=1.0, sensitivity_samples=64, method="minmax", smooth=False)
    res = run_tune(ModelDir.resolve(tiny_setup["model"]), tiny_setup["cset"], load_eval_set(tiny_setup["eval"]),
                   tiny_setup["root"] / "estimated", cfg, progress=events.append)
    tasks = _tasks_in_order(events)
    assert tasks.count(ESTIMATE_TASK) == 1
    at = tasks.index(ESTIMATE_TASK)
    assert tasks[at - 1] == FP32_PHASE and at < tasks.index("all-INT8 (minmax)")  # before the long part
    (message,) = [ev.message for ev in events if ev.task == ESTIMATE_TASK]
    assert message.startswith("tune will take about ") and "an FP32 text takes" in message
    e = res.result.time_estimate
    assert isinstance(e, TimeEstimate)
    fp32 = next(p for p in res.result.phases if p.phase == FP32_PHASE)
    assert e.text_seconds == pytest.approx(fp32.seconds / fp32.texts) and e.measured_texts == fp32.texts
    assert 0 < e.likely_seconds <= e.worst_seconds
    after = [p for p in res.result.phases if p.phase != FP32_PHASE]
    assert e.actual_seconds is not None and e.actual_seconds >= sum(p.seconds for p in after) > 0
    # every step is one of tune's phases, and every phase after the FP32 pass one of the steps
    assert {s.step for s in e.steps} == {p.phase for p in after}
    assert all(s.actual_seconds is not None for s in e.steps)
    assert res.doc["time_estimate"]["likely_seconds"] == e.likely_seconds  # in tune.json (and read back)
    assert e.resumed == 0
    # run again: the estimate says the first run's evaluations are reused
    events.clear()
    again = run_tune(ModelDir.resolve(tiny_setup["model"]), tiny_setup["cset"], load_eval_set(tiny_setup["eval"]),
                     tiny_setup["root"] / "estimated", cfg, progress=events.append)
    left = again.result.time_estimate.resumed
    assert left >= again.result.evaluations_reused > 0  # what the ledger holds; the run reuses what it needs
    (message,) = [ev.message for ev in events if ev.task == ESTIMATE_TASK]
    assert f"{left:,} evaluations of an earlier run are reused" in message


def test_compare_announces_its_estimate_first_and_its_report_shows_it_against_the_time_taken(tmp_path):
    from test_compare_tiny import build_engines

    import calibkit as ck

    paths = build_engines(tmp_path)
    events: list[ProgressEvent] = []
    c = ck.compare(paths["fp"], paths["int8"], paths["eval"], batch_size=16, progress=events.append,
                   executor="inline")
    tasks = _tasks_in_order(events)
    assert tasks[0] == ESTIMATE_TASK and tasks.count(ESTIMATE_TASK) == 1  # before any engine runs
    e = c.time_estimate
    assert e is not None and e.measured_texts == 64 and e.text_seconds > 0
    assert [s.step for s in e.steps] == ["evaluate engines", "per-layer measurements", "per-layer sensitivity",
                                         "speed"]
    assert all(s.actual_seconds is not None and s.actual_seconds > 0 for s in e.steps)
    assert e.actual_seconds is not None and e.actual_seconds >= sum(s.actual_seconds or 0 for s in e.steps)
    assert parse_result(json.loads(json.dumps(to_document(c)))) == c
    ck.render_report(c, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Time" in md and "Estimated before the long part started: about" in md
    assert "| per-layer sensitivity |" in md and "it took" in md


# ---------------------------------------------------------------- documents


def _estimate() -> TimeEstimate:
    e = estimate([Work("plan search", qdq=40_000), Work("flip risk", qdq=5_000)], 0.007, 11_557,
                 shortcuts={"--max-evaluations 20": [Work("plan search", qdq=20_000), Work("flip risk", qdq=5_000)]})
    return finish(e, 900.0, [PhaseCost("plan search", 800.0)])


def test_documents_without_the_estimate_still_load_and_a_negative_time_is_refused(tmp_path: Path) -> None:

    for cls in (R.Comparison, R.TuneResult):
        result = replace(_random(cls, random.Random(7)), time_estimate=_estimate())
        doc = json.loads(json.dumps(to_document(result)))
        assert parse_result(doc) == result and doc["time_estimate"]["shortcut"]["option"] == "--max-evaluations 20"
        old = {k: v for k, v in doc.items() if k != "time_estimate"}  # written before the estimate existed
        assert parse_result(old) == replace(result, time_estimate=None)
    check_domains(_estimate())  # the domain checks of a document read from a file, on the estimate alone
    for name in ("text_seconds", "likely_seconds", "worst_seconds", "actual_seconds"):
        with pytest.raises(DataError, match=rf"{name} should be at least 0"):
            check_domains(replace(_estimate(), **{name: -1.0}))


def test_the_tune_report_shows_the_estimate_and_the_shortcut(tmp_path: Path) -> None:
    import calibkit as ck

    result = replace(_random(R.TuneResult, random.Random(11)), time_estimate=_estimate())
    ck.render_report(result, tmp_path / "with")
    md = (tmp_path / "with" / "report.md").read_text()
    assert "## Time" in md and "--max-evaluations 20 would have shortened it" in md
    assert "| plan search |" in md and "it took 15 min" in md
    ck.render_report(replace(result, time_estimate=None), tmp_path / "without")
    assert "## Time" not in (tmp_path / "without" / "report.md").read_text()


# ---------------------------------------------------------------- the command line


def test_the_cli_prints_the_estimate_as_a_line_in_the_log_and_above_the_bars(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    line = summary(_estimate(), "tune")
    written: list[str] = []
    plain = _common.PlainProgress(interval=10.0, write=written.append)
    plain(ProgressEvent("FP32 reference", 10, 10))
    plain(ProgressEvent(ESTIMATE_TASK, 1, 1, message=line))
    assert written == [line]  # at once, whatever the interval
    term = Console(file=io.StringIO(), width=200, height=24, force_terminal=True, color_system=None)
    monkeypatch.setattr(_common, "console", term)
    monkeypatch.setenv("CALIBKIT_PROGRESS", "1")
    with _common.RichProgress() as bars:
        bars(ProgressEvent("FP32 reference", 10, 10))
        bars(ProgressEvent(ESTIMATE_TASK, 1, 1, message=line))
        assert ESTIMATE_TASK not in bars._tasks  # a line, not a bar
    assert line in term.file.getvalue()


# ---------------------------------------------------------------- demo run


def test_the_demo_prices_its_steps_after_sampling_and_names_fast_as_the_shortcut(tiny_setup):  # noqa: F811
    from types import SimpleNamespace

    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.demo.workflow import WorkflowOptions, _estimate_line, _Setup, _time_estimate
    from calibkit.evaluate.estimate import DemoSize, demo_steps

    md = ModelDir.resolve(tiny_setup["model"])
    ev = load_eval_set(tiny_setup["eval"])
    setup = _Setup("fine-tuned", tiny_setup["root"], tiny_setup["root"] / "runs", tiny_setup["root"] / "reports",
                   SimpleNamespace(embedder_dir=tiny_setup["root"] / "no-embedder"), md, None, ev, None,
                   TextTokenizer(md.tokenizer_path))
    events: list[ProgressEvent] = []
    e, _ = _time_estimate(WorkflowOptions(), setup, events.append)
    assert [ev.task for ev in events] == [ESTIMATE_TASK]
    assert events[0].message.startswith("the rest of the demo will take about")
    assert [s.step for s in e.steps] == ["smooth", "calibrate", "method accuracy", "compare", "tune", "deploy"]
    assert e.measured_texts == 64 and e.text_seconds > 0
    # the full variant at the speed of the demo's classifier: --fast, the quick variant, is the shortcut
    full = DemoSize(eval_texts=1057, calibration=512, nodes=49, methods=4, smooth=True, traffic=10_500,
                    embedder_traffic=2_400, sensitivity_samples=256, sensitivity_layers=12, layer_samples=512,
                    max_evaluations=40, tune_method="auto", auto_texts_per_node=128)
    quick = WorkflowOptions.quick()
    fast = replace(full, eval_texts=quick.eval_limit, calibration=quick.sample_size, traffic=quick.traffic_size,
                   embedder_traffic=quick.embedder_traffic_size, sensitivity_samples=quick.sensitivity_samples,
                   sensitivity_layers=quick.sensitivity_layers, layer_samples=quick.layer_samples,
                   max_evaluations=quick.tune_max_evaluations, tune_method=quick.tune_method,
                       tune_sensitivity_samples=quick.tune_sensitivity_samples)
    demo = estimate(demo_steps(full), 83 / 11_557, 64, shortcuts={"--fast": demo_steps(fast)})
    assert demo.shortcut is not None and demo.shortcut.option == "--fast"
    assert demo.shortcut.likely_seconds < demo.likely_seconds / 2  # the speed rounds and deploy cost both alike
    tune = next(s for s in demo.steps if s.step == "tune")  # the demo's tune is its longest step
    assert tune.likely_seconds == max(s.likely_seconds for s in demo.steps) > demo.likely_seconds / 3
    # the index page's Time section says what was estimated and what it took
    s = SimpleNamespace(time_estimate=finish(demo, 3000.0))
    line = _estimate_line(s)
    assert "Estimated after sampling" in line and "they took 50 min" in line and "--fast: about" in line


@pytest.mark.parametrize("size", [DEMO, replace(DEMO, method="minmax", methods=1, auto_texts=0, variants=1),
                                  replace(DEMO, search=400, holdout=400, sensitivity=64, max_evaluations=6,
                                          search_traffic=300, holdout_traffic=300)])
def test_every_range_tune_and_compare_print_is_at_most_twice_its_low_end(size: TuneSize) -> None:
    """The width rule: the high end of every printed range (the whole, each step, the shortcut) is no more than
    twice its low end, for tune's steps and compare's, whatever the run's size."""
    from calibkit.evaluate.estimate import compare_shortcuts, compare_steps

    compares = [CompareSize(4000, ("fp32", "qdq"), 0, 512, 3, 256, 48, speed=True),
                CompareSize(200, ("qdq", "qdq", "fp32"), 600, 200, 5, 64, 6)]
    runs = [(tune_steps(size), tune_shortcuts(size))] + [(compare_steps(z), compare_shortcuts(z)) for z in compares]
    for steps, shortcuts in runs:
        for lanes in (1.0, 3.0):
            e = estimate(steps, 0.011, 64, shortcuts=shortcuts, lanes=lanes)
            ranges = [(e.likely_seconds, e.worst_seconds)] + [(s.likely_seconds, s.worst_seconds) for s in e.steps]
            if e.shortcut is not None:
                ranges.append((e.shortcut.likely_seconds, e.shortcut.worst_seconds))
            assert e.likely_seconds > 0
            for low, high in ranges:
                assert low <= high <= 2.0 * low * (1 + 1e-12)


@pytest.mark.parametrize(("size", "text_seconds", "took"), [
    # the demo's compares at 2f20ce0 (FP32 text timed at 3.4 ms): FP32 vs INT8 beside 4,000 log texts of 2.1x the
    # eval texts' tokens, and FP16 vs INT8 with the FP32 reference
    (CompareSize(2114, ("fp32", "qdq"), 4000, 512, 3, 256, 12, speed=True, traffic_scale=2.118), 0.0034, 153),
    (CompareSize(2114, ("qdq", "qdq", "fp32"), 0, 512, 5, speed=True), 0.0034, 53),
    # the demo embedder, every default, its traffic the eval set (3402d7a: 2,674 and 4,000 texts)
    (CompareSize(2674, ("fp32", "qdq"), 0, 512, 3, 256, 48, speed=True), 0.0063, 237),
    (CompareSize(4000, ("fp32", "qdq"), 0, 512, 3, 256, 48, speed=True), 0.0057, 266),
], ids=["demo-fp32-int8", "demo-fp16-int8", "embedder-2674", "embedder-4000"])
def test_compares_measured_on_two_quiet_cores_took_a_time_inside_their_printed_range(size: CompareSize,
                                                                                     text_seconds: float,
                                                                                     took: float) -> None:
    """docs/measured.md: what each compare's estimated part took on the 2-core machine, quiet, against the
    range its estimate prints (the pricing is calibrated on these runs, so this keeps the calibration, not
    an independent check)."""
    from calibkit.evaluate.estimate import compare_steps

    e = estimate(compare_steps(size), text_seconds, 64)
    assert e.likely_seconds <= took <= e.worst_seconds
