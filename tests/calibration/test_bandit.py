"""SplitPlace's two-context bandit: the reward by hand, ε's decay, learning per context, UCB under drift, its file."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from calibration.bandit import (
    BANDIT_FILENAME, BANDIT_SCHEMA, HIGH, LAYER, LEARN, LOW, RUN, SEMANTIC, Bandit, reward,
)
from splitedge.errors import CalibrationError

LOW_DEADLINE, HIGH_DEADLINE = 10.0, 1000.0  # either side of the layer split's 100 ms
LAYER_MS = 100.0


def world(swap: bool = False):
    """A synthetic fleet, seeded by the caller's rng: the layer split always answers in 100 ms
    (so R stays 100 and a deadline's context is fixed), at an accuracy whose credit averages 0.6;
    the semantic split answers in 5 ms nine times in ten (else 2 s), credit 0.3.
    Expected rewards: low context layer 0.30, semantic 0.60; high context layer 0.80, semantic 0.60.
    ``swap`` changes their worth (the layer split's credit drops to 0, the semantic split's rises to
    0.6): low context layer 0.0, semantic 0.75; high context layer 0.5, semantic 0.75."""

    def finish(arm: str, deadline: float, rng: random.Random) -> tuple[float, float]:
        if arm == LAYER:
            return LAYER_MS, 0.9 + rng.uniform(0.04, 0.08) if not swap else 0.9
        response = 5.0 if rng.random() < 0.9 else 2000.0
        return response, 0.93 if not swap else 0.9 + rng.uniform(0.04, 0.08)

    return finish


def play(bandit: Bandit, rng: random.Random, steps: int, finish) -> list[tuple[str, str]]:
    """``steps`` frames with deadlines drawn low or high at random; returns (context, arm) per frame."""
    played = []
    for _ in range(steps):
        deadline = LOW_DEADLINE if rng.random() < 0.5 else HIGH_DEADLINE
        context = bandit.context(deadline)
        arm = bandit.choose(deadline)
        response, accuracy = finish(arm, deadline, rng)
        bandit.observe(arm, deadline, response, accuracy, context=context)
        played.append((context, arm))
    return played


def share(played: list[tuple[str, str]], context: str, arm: str) -> float:
    arms = [a for c, a in played if c == context]
    return sum(a == arm for a in arms) / len(arms)


# --- the reward ---------------------------------------------------------------------------


@pytest.mark.parametrize(("deadline", "response", "accuracy", "expected"), [
    (50.0, 40.0, 1.0, 1.0),  # met, perfect: 0.5 + 0.5
    (50.0, 50.0, 0.95, 0.75),  # met on the dot: 0.5 + 0.5 x 0.5
    (50.0, 60.0, 0.95, 0.25),  # missed: 0 + 0.5 x 0.5
    (50.0, 40.0, 0.80, 0.5),  # below 90 %: no accuracy credit
    (50.0, 60.0, 0.90, 0.0),
    (50.0, 40.0, 0.97, 0.85),  # 0.5 + 0.5 x 0.7
])
def test_reward_by_hand(deadline: float, response: float, accuracy: float, expected: float) -> None:
    assert reward(deadline, response, accuracy) == pytest.approx(expected)


def test_reward_refuses_what_is_not_a_fraction_or_a_time() -> None:
    with pytest.raises(CalibrationError, match="accuracy"):
        reward(50.0, 40.0, 1.5)
    with pytest.raises(CalibrationError, match="response_ms"):
        reward(50.0, float("nan"), 0.9)


# --- ε-greedy while learning (SplitPlace Eq. 6-8) -------------------------------------------


def test_epsilon_decays_when_an_intervals_mean_reward_passes_the_threshold() -> None:
    bandit = Bandit(random.Random(0), interval=2)  # k = 0.1: ε from 1, ρ from 0.1
    assert (bandit.epsilon, bandit.threshold) == (1.0, pytest.approx(0.1))
    bandit.observe(SEMANTIC, 50.0, 40.0, 0.8)  # 0.5: the interval is not over yet
    assert bandit.epsilon == 1.0
    bandit.observe(SEMANTIC, 50.0, 60.0, 0.8)  # 0.0: mean 0.25 > 0.1
    assert bandit.epsilon == pytest.approx(0.9) and bandit.threshold == pytest.approx(0.11)
    bandit.observe(SEMANTIC, 50.0, 60.0, 0.8)
    bandit.observe(SEMANTIC, 50.0, 60.0, 0.91)  # mean 0.025 < 0.11: unchanged
    assert bandit.epsilon == pytest.approx(0.9) and bandit.threshold == pytest.approx(0.11)
    for _ in range(2 * 40):  # rewards of 1: ε x 0.9 each interval until ρ reaches its cap of 1
        bandit.observe(SEMANTIC, 50.0, 40.0, 1.0)
    assert bandit.threshold == 1.0
    steps = 1 + 24  # 0.11 x 1.1^23 < 1 < 0.11 x 1.1^24: the 24th further increment reaches the cap
    assert bandit.epsilon == pytest.approx(0.9 ** steps)
    bandit.observe(SEMANTIC, 50.0, 40.0, 1.0)
    bandit.observe(SEMANTIC, 50.0, 40.0, 1.0)  # mean 1 is not > 1: no further decay
    assert bandit.epsilon == pytest.approx(0.9 ** steps)


def test_run_mode_leaves_epsilon_alone() -> None:
    bandit = Bandit(random.Random(0), mode=RUN, interval=1)
    bandit.observe(SEMANTIC, 50.0, 40.0, 1.0)
    assert bandit.epsilon == 1.0


@pytest.mark.parametrize("seed", range(5))
def test_learning_converges_to_the_better_arm_of_each_context(seed: int) -> None:
    rng = random.Random(seed)
    bandit = Bandit(random.Random(1000 + seed), layer_ms=LAYER_MS)
    played = play(bandit, rng, 1500, world())
    last = played[-500:]
    assert share(last, LOW, SEMANTIC) >= 0.85  # the layer split would miss a 10 ms deadline
    assert share(last, HIGH, LAYER) >= 0.85  # with time enough, the exact split wins
    assert bandit.epsilon < 0.2
    assert bandit.stats(LOW, SEMANTIC).mean == pytest.approx(0.6, abs=0.05)
    assert bandit.stats(HIGH, LAYER).mean == pytest.approx(0.8, abs=0.05)


def test_the_context_follows_the_layer_response_estimate() -> None:
    bandit = Bandit(random.Random(0))
    assert bandit.layer_ms is None and bandit.context(1.0) == HIGH  # nothing known: every deadline is high
    bandit.observe(SEMANTIC, 50.0, 5.0, 0.95)
    assert bandit.layer_ms is None  # only layer responses move R
    bandit.observe(LAYER, 50.0, 40.0, 0.99)
    assert bandit.layer_ms == 40.0  # the first layer response sets R
    bandit.observe(LAYER, 50.0, 140.0, 0.99)
    assert bandit.layer_ms == pytest.approx(0.1 * 140 + 0.9 * 40)  # Eq. 2, φ = 0.1 on the newest
    assert (bandit.context(49.9), bandit.context(50.0)) == (LOW, HIGH)
    assert Bandit(layer_ms=30.0).context(29.0) == LOW  # the latency model's prediction seeds R


def test_a_frame_without_a_given_context_is_filed_under_the_context_before_its_response() -> None:
    bandit = Bandit(random.Random(0), layer_ms=40.0)
    bandit.observe(LAYER, 45.0, 200.0, 0.99)  # 45 >= 40: high, although R is now 56
    assert bandit.stats(HIGH, LAYER).count == 1 and bandit.stats(LOW, LAYER).count == 0


# --- UCB at run time (SplitPlace Eq. 9, discounted) -----------------------------------------


def test_ucb_keeps_trying_the_worse_arm_rarely_and_recovers_when_the_arms_swap() -> None:
    rng = random.Random(7)
    bandit = Bandit(random.Random(8), layer_ms=LAYER_MS, discount=0.99)
    play(bandit, rng, 600, world())  # learn first: the prior UCB starts from
    bandit.mode = RUN
    played = play(bandit, rng, 2000, world())
    high = [a for c, a in played if c == HIGH][-500:]
    worse = high.count(SEMANTIC) / len(high)
    # Still tried, never for long: with γ = 0.99 the context's weights sum to about 100, and
    # semantic (mean 0.6) is retried once its weight N makes 0.6 + 0.5 sqrt(ln 100 / N) pass layer's
    # 0.8 + 0.11, at N ≈ 12: about one high frame in eight (0.09-0.15 over seeds 0-9).
    assert 0.02 <= worse <= 0.2
    assert share(played[-1000:], LOW, SEMANTIC) >= 0.85
    # The arms swap: the semantic split is now the better one in both contexts.
    played = play(bandit, rng, 3000, world(swap=True))
    assert share(played[-1000:], HIGH, SEMANTIC) >= 0.85
    assert share(played[-1000:], LOW, SEMANTIC) >= 0.85


def test_ucb_is_deterministic_and_tries_an_unplayed_arm_first() -> None:
    bandit = Bandit(random.Random(0), mode=RUN, layer_ms=LAYER_MS)
    assert bandit.choose(HIGH_DEADLINE) == LAYER  # neither tried: the first listed
    bandit.observe(LAYER, HIGH_DEADLINE, 100.0, 1.0)
    assert bandit.choose(HIGH_DEADLINE) == SEMANTIC  # never tried in this context: infinite bound
    bandit.observe(SEMANTIC, HIGH_DEADLINE, 100.0, 0.9)
    # 1.0 + 0.5 sqrt(ln 1.995 / 0.995) ≈ 1.42 against 0 + 0.5 sqrt(ln 1.995 / 1) ≈ 0.42
    assert bandit.choose(HIGH_DEADLINE) == LAYER
    assert bandit.choose(LOW_DEADLINE) == LAYER  # the low context knows nothing yet


@pytest.mark.parametrize("mode", [LEARN, RUN])
def test_an_unavailable_arm_is_never_chosen(mode: str) -> None:
    bandit = Bandit(random.Random(3), mode=mode, layer_ms=LAYER_MS)
    play(bandit, random.Random(4), 300, world())
    for deadline in (LOW_DEADLINE, HIGH_DEADLINE) * 100:
        assert bandit.choose(deadline, available={LAYER}) == LAYER
        assert bandit.choose(deadline, available=[SEMANTIC, "local"]) == SEMANTIC
    with pytest.raises(CalibrationError, match="no arm available"):
        bandit.choose(HIGH_DEADLINE, available=set())


def test_describe_says_what_it_knows() -> None:
    bandit = Bandit(random.Random(0), layer_ms=LAYER_MS)
    bandit.observe(SEMANTIC, LOW_DEADLINE, 5.0, 0.95)
    lines = bandit.describe()
    assert lines[0].startswith("split choice (SplitPlace bandit): mode learn, ε 1.000")
    assert "100.0 ms" in lines[0]
    assert lines[1].startswith("  low ") and "semantic n=1 mean 0.750" in lines[1] and lines[1].endswith("-> semantic")
    assert "layer n=0 mean 0.000" in lines[2] and lines[2].endswith("-> layer")


# --- its file -------------------------------------------------------------------------------


def test_state_round_trips_and_decides_alike(tmp_path: Path) -> None:
    bandit = Bandit(random.Random(5), layer_ms=LAYER_MS, interval=5, discount=0.98)
    play(bandit, random.Random(6), 400, world())
    bandit.observe(LAYER, HIGH_DEADLINE, 100.0, 0.95)  # an interval part-way through
    written = bandit.save(tmp_path)
    assert written == tmp_path / BANDIT_FILENAME
    assert [p.name for p in tmp_path.iterdir()] == [BANDIT_FILENAME]  # no temporary file left
    loaded = Bandit.load(tmp_path, random.Random(9))
    assert loaded.to_dict() == bandit.to_dict()
    assert json.loads(written.read_text())["schema"] == BANDIT_SCHEMA
    bandit._rng = random.Random(9)
    for deadline in (LOW_DEADLINE, HIGH_DEADLINE) * 20:
        assert loaded.choose(deadline) == bandit.choose(deadline)
    bandit.mode = loaded.mode = RUN
    assert Bandit.load(bandit.save(tmp_path / "other.json")).describe() == loaded.describe()


def _corrupt(tmp_path: Path, edit) -> Path:
    bandit = Bandit(random.Random(0), layer_ms=LAYER_MS)
    bandit.observe(LAYER, HIGH_DEADLINE, 100.0, 0.95)
    data = bandit.to_dict()
    edit(data)
    path = tmp_path / BANDIT_FILENAME
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(schema="splitedge.bandit/9"), r"bandit\.json: schema: expected splitedge\.bandit/1"),
    (lambda d: d.update(epsilon=1.5), r"bandit\.json: epsilon: expected a fraction"),
    (lambda d: d.update(mode="explore"), r"bandit\.json: mode: expected one of learn, run"),
    (lambda d: d.pop("threshold"), r"bandit\.json: bandit\.threshold: missing"),
    (lambda d: d["params"].update(discount=0), r"bandit\.json: params\.discount: expected a fraction in \(0, 1\]"),
    (lambda d: d["contexts"]["high"]["layer"].update(count=-1), r"contexts\.high\.layer\.count: expected an integer"),
    (lambda d: d["contexts"]["low"].pop("semantic"), r"contexts\.low\.semantic: missing"),
    (lambda d: d["contexts"]["high"]["layer"].update(mean=2.0), r"contexts\.high\.layer: rewards are at most 1"),
    (lambda d: d.update(layer_ms="fast"), r"bandit\.json: layer_ms: expected a number"),
])
def test_a_corrupt_file_is_refused_naming_the_field(tmp_path: Path, edit, message: str) -> None:
    path = _corrupt(tmp_path, edit)
    with pytest.raises(CalibrationError, match=message) as caught:
        Bandit.load(path)
    assert "\n" not in str(caught.value)


def test_not_json_and_no_file_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="no bandit state"):
        Bandit.load(tmp_path)
    (tmp_path / BANDIT_FILENAME).write_text("{not json")
    with pytest.raises(CalibrationError, match="not valid JSON"):
        Bandit.load(tmp_path)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(CalibrationError, match="mode"):
        Bandit(mode="greedy")
    with pytest.raises(CalibrationError, match="arm"):
        Bandit().observe("chain", 50.0, 40.0, 0.9)
    with pytest.raises(CalibrationError, match="context"):
        Bandit().observe(LAYER, 50.0, 40.0, 0.9, context="medium")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_state_that_is_no_file_is_refused_not_read(kind: str, tmp_path: Path) -> None:
    """A bandit.json that is a FIFO hung ``run``'s start; a link to /dev/zero was read until memory
    ran out (issue 45): both are one CalibrationError naming the file."""
    path = tmp_path / BANDIT_FILENAME
    os.mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")
    with pytest.raises(CalibrationError, match=f"{path}: cannot read the bandit state: not a regular file"):
        Bandit.load(tmp_path)
