"""The drafting decisions on synthetic numbers: prompt lookup's matches, a row's acceptance, the
fitted cost of a wider step, and the width the gate picks from them."""

import pytest

from mlxd.engine.speculate import gate
from mlxd.engine.speculate.gate import Acceptance, StepCosts, choose_width
from mlxd.engine.speculate.ngram import NgramIndex


def test_lookup_drafts_what_followed_the_longest_match() -> None:
    corpus = [1, 2, 3, 4, 5, 9, 9, 2, 3, 7, 8]
    index = NgramIndex(corpus)
    assert index.propose([0, 2, 3], 3) == [7, 8]  # the latest "2 3" among equal agreement
    assert index.propose([1, 2, 3], 3) == [4, 5, 9]  # "1 2 3" agrees further back
    assert index.propose([6, 6], 3) == []
    assert index.propose(corpus, 4) == []  # the corpus's own tail is not a match of itself
    index.extend([2, 3])
    assert index.propose(index.tokens, 2) == [7, 8]


def test_a_repeated_line_follows_the_occurrence_whose_context_agrees() -> None:
    """Two places share "x = 0"; the one whose preceding tokens match the tail wins even
    though the other is later."""
    a, b = [10, 11, 12, 13], [20, 21, 22, 23]
    line = [5, 6, 7]
    corpus = a + line + [100, 101] + b + line + [200, 201]
    index = NgramIndex(corpus)
    assert index.propose([*a, *line], 2) == [100, 101]
    assert index.propose([*b, *line], 2) == [200, 201]


def test_acceptance_decays_toward_what_happens() -> None:
    acc = Acceptance()
    assert acc.p == pytest.approx(0.5)
    for _ in range(10):
        acc.update(4, 4)  # every draft kept
    assert acc.p > 0.9
    assert acc.expected(4) == pytest.approx(sum(acc.p**j for j in range(5)))
    for _ in range(10):
        acc.update(4, 0)  # the first draft rejected each time
    assert acc.p < 0.3


def test_measured_costs_fit_one_slope() -> None:
    costs = StepCosts()
    assert costs.ratio(1, 4) == pytest.approx(1 + gate.PRIOR_COST * 4)
    costs.seconds = {(1, 0): 1.0, (1, 4): 3.0}
    assert costs.ratio(1, 2) == pytest.approx(2.0)  # slope 0.5 a position, from width 4
    assert costs.ratio(3, 2) == pytest.approx(1 + gate.PRIOR_COST * 2)  # another rows bucket


def test_the_gate_drafts_only_when_it_pays() -> None:
    costs = StepCosts()
    good, bad = Acceptance(accepted=20, tried=21), Acceptance(accepted=0, tried=20)
    assert choose_width(1, [], costs, 8) == 0
    assert choose_width(1, [(good, 8)], costs, 8) >= 4
    assert choose_width(1, [(bad, 8)], costs, 8) == 0
    assert choose_width(1, [(good, 0)], costs, 8) == 0  # nothing to draft
    costs.seconds = {(1, 0): 1.0, (1, 1): 3.0}  # a position costs two plain steps (a CPU)
    assert choose_width(1, [(good, 8)], costs, 8) == 0
    costs.seconds = {(32, 0): 1.0, (32, 8): 1.4}
    assert choose_width(32, [(good, 8)], costs, 8) == 0  # one drafting row of 32 does not pay
    assert choose_width(32, [(good, 8)] * 32, costs, 8) == 8


def test_the_plain_baseline_is_measured_first_and_then_refreshed(monkeypatch) -> None:
    """A row that always has drafts (a draft model's) still lets plain steps be timed: before
    any plain sample of its rows bucket, and again every REFRESH verify steps."""
    clock = iter(float(t) for t in range(1000))
    monkeypatch.setattr(gate.time, "perf_counter", lambda: next(clock))
    costs = StepCosts()
    assert costs.needs_plain(4)
    costs.start(4, 0)
    costs.start(4, 3)  # the plain step's sample lands here
    assert not costs.needs_plain(4) and costs.needs_plain(1)  # another bucket: its own
    for _ in range(gate.REFRESH - 1):
        costs.start(4, 3)
    assert not costs.needs_plain(4)
    costs.start(4, 3)
    assert costs.needs_plain(4)
    costs.pause()  # rows changed: the next start measures nothing
    costs.start(4, 0)
    assert costs.needs_plain(4)


def test_acceptance_forgets_toward_the_prior() -> None:
    a = Acceptance(accepted=0, tried=40)
    before = a.p
    for _ in range(300):
        a.forget(0.97)
    assert before < a.p < 0.5 + 1e-9
    assert a.p == pytest.approx(0.5, abs=0.01)
