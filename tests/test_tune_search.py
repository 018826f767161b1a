import itertools

import pytest

from calibkit.evaluate.search import int8_flops_fraction, search_plan
from calibkit.evidence.candidates import as_plan

FLOPS = {f"n{i}": float(10 + i) for i in range(10)}


def additive_evaluator(harm: dict[str, float], base: float):
    """Accuracy = base - sum of the harm of every node left in INT8 (independent layers)."""
    calls = []

    def evaluate(plans):
        calls.append(list(plans))
        return [base - sum(h for n, h in harm.items() if n not in p) for p in plans]

    return evaluate, calls


def brute_force(harm, base, threshold):
    best = None
    nodes = list(harm)
    for r in range(len(nodes) + 1):
        for combo in itertools.combinations(nodes, r):
            acc = base - sum(h for n, h in harm.items() if n not in combo)
            if acc >= threshold:
                frac = int8_flops_fraction(as_plan(combo), FLOPS)
                if best is None or frac > best:
                    best = frac
    return best


def test_all_int8_meets_target_needs_one_evaluation():
    evaluate, calls = additive_evaluator({n: 0.0001 for n in FLOPS}, 0.9)
    out = search_plan(list(FLOPS), FLOPS, evaluate, threshold=0.89)
    assert out.best is not None and out.best.plan == ()
    assert out.best.int8_flops_fraction == 1.0
    assert len(calls) == 1


def test_finds_the_harmful_layers_and_prunes_harmless_ones():
    harm = {n: 0.0 for n in FLOPS}
    harm.update({"n3": 0.02, "n7": 0.015, "n1": 0.001})
    evaluate, _ = additive_evaluator(harm, 0.90)
    # ranking slightly wrong: a harmless node sits between the harmful ones
    ranking = ["n3", "n0", "n7", "n1", "n2", "n4", "n5", "n6", "n8", "n9"]
    out = search_plan(ranking, FLOPS, evaluate, threshold=0.895)
    assert out.best is not None
    assert set(out.best.plan) == {"n3", "n7"}
    assert out.best.meets
    assert abs(out.best.int8_flops_fraction - brute_force(harm, 0.90, 0.895)) < 1e-12
    assert all(m.accuracy == 0.90 - sum(h for n, h in harm.items() if n not in m.plan) for m in out.tried)


def test_unreachable_target_reports_no_plan():
    harm = {n: 0.01 for n in FLOPS}
    evaluate, _ = additive_evaluator(harm, 0.5)
    out = search_plan(list(FLOPS), FLOPS, evaluate, threshold=0.9)
    assert out.best is None
    assert len(out.tried) >= 2


def test_budget_is_respected():
    harm = {n: 0.01 for n in FLOPS}
    evaluate, calls = additive_evaluator(harm, 0.9)
    out = search_plan(list(FLOPS), FLOPS, evaluate, threshold=0.899, max_evaluations=3)
    assert sum(len(c) for c in calls) <= 3
    assert len(out.tried) <= 3


def test_int8_fraction():
    assert int8_flops_fraction((), FLOPS) == 1.0
    total = sum(FLOPS.values())
    assert abs(int8_flops_fraction(("n0", "n9"), FLOPS) - (total - 10 - 19) / total) < 1e-12


def test_agreement_constraint_keeps_more_layers_than_accuracy_alone():
    """Accuracy barely moves (flips cancel out) but agreement with FP32 does: --min-agreement decides."""
    flips = {n: 0.0 for n in FLOPS}
    flips.update({"n2": 0.012, "n5": 0.004})

    def evaluate(plans):
        return [(0.9, 1.0 - sum(f for n, f in flips.items() if n not in p)) for p in plans]

    ranking = ["n2", "n5"] + [n for n in FLOPS if n not in ("n2", "n5")]
    loose = search_plan(ranking, FLOPS, evaluate, threshold=0.89)
    assert loose.best is not None and loose.best.plan == ()
    strict = search_plan(ranking, FLOPS, evaluate, threshold=0.89, min_agreement=0.99)
    assert strict.best is not None and strict.best.plan == ("n2",)
    assert strict.best.agreement == pytest.approx(0.996)
    assert not next(m for m in strict.tried if m.plan == ()).meets
    never = search_plan(ranking, FLOPS, evaluate, threshold=0.89, min_agreement=1.01)
    assert never.best is None



def test_agreement_must_clear_the_target_by_its_own_uncertainty():
    """99.2 % of 1,500 examples: met at the point estimate, not when its one-sided 90 % bound must reach 99 %
    (that bound is 98.9 %); keeping the layer that flips most (99.6 %, bound 99.4 %) is."""
    from calibkit.evidence.intervals import wilson_lower

    flips = {n: 0.0 for n in FLOPS}
    flips.update({"n2": 0.004, "n5": 0.004})

    def evaluate(plans):
        return [(0.9, 1.0 - sum(f for n, f in flips.items() if n not in p)) for p in plans]

    ranking = ["n2", "n5"] + [n for n in FLOPS if n not in ("n2", "n5")]
    point = search_plan(ranking, FLOPS, evaluate, threshold=0.89, min_agreement=0.99)
    assert point.best is not None and point.best.plan == ()
    bounded = search_plan(ranking, FLOPS, evaluate, threshold=0.89, min_agreement=0.99, agreement_examples=1500,
                          agreement_z=1.2815515655446004)
    assert bounded.best is not None and bounded.best.plan == ("n2",)
    assert wilson_lower(0.992, 1500, 1.2815515655446004) < 0.99 < wilson_lower(0.996, 1500, 1.2815515655446004)
    assert wilson_lower(0.992, 1500, 0.0) == 0.992


def test_anchors_measure_the_next_prefixes_past_the_first_pass_and_do_not_move_the_choice():
    """The first prefix that passes keeps 4 nodes; one anchor measures the prefix of 8 (stage "anchor"), a plan
    with margin for the holdout confirmation. The search's choice is the same as without anchors."""
    harm = {n: 0.0 for n in FLOPS}
    harm.update({"n0": 0.01, "n1": 0.01, "n2": 0.01, "n3": 0.01, "n4": 0.001})
    ranking = list(FLOPS)
    evaluate, _ = additive_evaluator(harm, 0.90)
    plain = search_plan(ranking, FLOPS, evaluate, threshold=0.895)
    evaluate, calls = additive_evaluator(harm, 0.90)
    anchored = search_plan(ranking, FLOPS, evaluate, threshold=0.895, anchors=1)
    anchor = [m for m in anchored.tried if m.stage == "anchor"]
    assert [m.plan for m in anchor] == [as_plan(ranking[:8])] and anchor[0].meets
    assert [as_plan(ranking[:8])] in calls  # measured on its own, right after the prefix of 4 passed
    assert not any(m.stage == "anchor" for m in plain.tried)
    assert anchored.best is not None and plain.best is not None and anchored.best.plan == plain.best.plan
    two = search_plan(ranking, FLOPS, additive_evaluator(harm, 0.90)[0], threshold=0.895, anchors=2)
    # the next size is the whole ranking: a plan that keeps every ranked node is no anchor
    assert [m.plan for m in two.tried if m.stage == "anchor"] == [as_plan(ranking[:8])]
    none_left = search_plan(ranking, FLOPS, additive_evaluator(harm, 0.90)[0], threshold=0.895, anchors=1,
                            max_evaluations=3)  # all-INT8, prefixes 1, 2: the budget ends before any anchor
    assert len(none_left.tried) == 3 and not any(m.stage == "anchor" for m in none_left.tried)


def test_anchors_with_a_margin_bisect_for_the_fewest_kept_layers_that_have_it():
    """Agreement rises 0.01 per kept node of the first eight: the prefix of 4 meets 0.95 (0.96) without the
    margin (0.975); the doubling (8: 1.0) has it, and one halving of the gap finds the prefix of 6 (0.98); the
    gap left (4 to 6) is half the first prefix, so 5 is not measured. A first passing prefix that already has
    the margin measures no anchor."""
    ranking = list(FLOPS)

    def evaluate(plans):
        return [(0.9, 0.92 + 0.01 * sum(n in p for n in ranking[:8])) for p in plans]

    out = search_plan(ranking, FLOPS, evaluate, threshold=0.0, min_agreement=0.95, anchors=1,
                      margin=lambda m: m.agreement >= 0.975)
    assert [len(m.plan) for m in out.tried if m.stage == "anchor"] == [8, 6]
    plain = search_plan(ranking, FLOPS, evaluate, threshold=0.0, min_agreement=0.95)
    assert out.best is not None and plain.best is not None and out.best.plan == plain.best.plan  # unmoved
    wide = search_plan(ranking, FLOPS, evaluate, threshold=0.0, min_agreement=0.95, anchors=1,
                       margin=lambda m: m.agreement >= 0.955)
    assert not any(m.stage == "anchor" for m in wide.tried)
    short = search_plan(ranking, FLOPS, evaluate, threshold=0.0, min_agreement=0.95, anchors=1,
                        margin=lambda m: m.agreement > 1.0)  # no prefix has it: the one anchor, no bisect
    assert [len(m.plan) for m in short.tried if m.stage == "anchor"] == [8]


def test_prune_returns_small_layers_together_and_big_ones_alone():
    """Layers under prune_min_share of the FLOPs cost one evaluation together, not one each."""
    flops = {"big0": 100.0, "big1": 90.0, **{f"s{i}": 0.1 for i in range(8)}}
    harm = {n: 0.0 for n in flops}
    harm["big0"] = 0.05  # the only harmful layer
    evaluate, calls = additive_evaluator(harm, 0.90)
    ranking = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "big0", "big1"]  # a poor ranking: all kept
    out = search_plan(ranking, flops, evaluate, threshold=0.899, prune_min_share=0.01)
    assert out.best is not None and out.best.plan == ("big0",)
    pruned = [m for m in out.tried if m.stage == "prune"]
    assert len(pruned) <= 3  # big1, big0 (refused), then the eight small ones at once
    alone = search_plan(ranking, flops, additive_evaluator(harm, 0.90)[0], threshold=0.899)
    assert len([m for m in alone.tried if m.stage == "prune"]) > len(pruned)


def test_prune_budget_caps_the_prune_stage_only():
    harm = {n: 0.0 for n in FLOPS}
    harm["n3"] = 0.05
    ranking = list(reversed(list(FLOPS)))  # n3 comes late: the prefix keeps many harmless layers
    evaluate, _ = additive_evaluator(harm, 0.90)
    out = search_plan(ranking, FLOPS, evaluate, threshold=0.899, prune_budget=2)
    assert len([m for m in out.tried if m.stage == "prune"]) == 2
    assert out.best is not None and "n3" in out.best.plan
