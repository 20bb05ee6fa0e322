"""Layer split or semantic split, frame by frame: SplitPlace's two-context bandit (seed 004, §4.1).

A **layer** split (one cut, or a chain of hosts) is exact but answers later; a **semantic** split
(the trunk on the board, K fragments in parallel on hosts) answers sooner and is less accurate.
Which one a frame should take depends on its deadline, so SplitPlace keeps one two-armed bandit
per *context* (Eq. 3-4): **low** when the deadline is below a running estimate R of the layer
split's response time, **high** otherwise. R is an exponential moving average of the layer
responses observed (Eq. 2).

Reward of a finished frame (Eq. 3-4 with the authors' accuracy term, see :func:`reward`):

    reward = 0.5 · [response ≤ deadline] + 0.5 · clip((accuracy − 0.9) · 10, 0, 1)

Two modes:

* ``learn`` — feedback ε-greedy (Eq. 6-8): a random arm with probability ε, else the arm of
  best mean reward in the frame's context; every ``interval`` observations, when their mean
  reward is above the threshold ρ, ε ← (1 − k)·ε and ρ ← (1 + k)·ρ.
* ``run`` — UCB (Eq. 9): the arm of largest ``Q + c·sqrt(log n / N)``. SplitPlace counts t and
  N over all time; a board's link drifts (people walk past, another board starts streaming),
  and undiscounted counts make UCB1 take ever longer to notice that arms swapped: after N
  frames on an arm its mean moves by 1/N per frame. So the counts and means UCB reads are
  **discounted** (D-UCB, Garivier & Moulines 2011, "On upper-confidence bound policies for
  switching bandit problems", ALT): at each observation of a context both arms' weights decay
  by γ, so the statistics cover about the last 1/(1 − γ) frames of that context, the worse
  arm's weight decays until its bonus makes it tried again (rarely: a bounded share set by γ, c
  and the gap), and regret over T frames with Υ swaps is O(sqrt(Υ·T)·log T) rather than linear.
  γ = 1 is Eq. 9 exactly. The discounted statistics are kept in ``learn`` mode too, so what
  was learned is UCB's prior when the board switches to ``run``.

Where the paper is silent or the authors' code differs, the choices are (each a constructor
argument, persisted with the state):

* ε starts at 1 and ρ at k = 0.1, k = 0.1 (§4.1.2, §6.3); the comparison is strict (``> ρ``,
  Eq. 7-8) and ρ is capped at 1 (the authors' code), so ε stops decaying once the mean reward
  cannot exceed ρ. The authors' code starts at ε = 0.95, ρ = 0.45 with multipliers 0.98 and 1.05.
* The "interval" whose mean reward Eq. 7 compares is ``interval`` observations (default 10):
  the paper's is a scheduling interval with many tasks; a board sees one frame at a time.
  OMAB is the mean reward of the interval's frames (as the authors' code computes it), not the
  mean of the four per-(context, arm) means, which is undefined for an arm not played.
* Eq. 5's Q is the sample mean (γ = 1/N, as the authors' code updates it) for ``learn`` and
  for :meth:`Bandit.describe`; UCB reads the discounted mean.
* Eq. 2's weight φ of the newest response is 0.1 (the authors' code: ``0.1·new + 0.9·old``; the
  paper's §6.1 states φ = 0.9 on the newest, which on per-frame responses would let every
  frame's jitter flip the context). R starts at the latency model's prediction of the layer
  split when the caller has one (``layer_ms``), else at the first layer response observed;
  until then every frame is in the high context (the paper's R starts at 0, §6.3).
* A frame's context is the one its deadline had when it was chosen: :meth:`Bandit.observe`
  takes it from the caller (``context``), else recomputes it before R takes in the response.
* c = 0.5 (§6.1); γ = 0.995 (about the last 200 frames of a context: seconds at a camera's
  rate, the time scale on which a Wi-Fi link changes).

State is JSON (:meth:`Bandit.save` writes ``bandit.json`` beside ``calibration.json``
atomically; :meth:`Bandit.load` refuses a corrupt file naming the field).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from splitedge import Fields, shown, write_atomically
from splitedge.errors import CalibrationError
from splitedge.reading import read_text_bounded

__all__ = [
    "ARMS", "BANDIT_FILENAME", "BANDIT_SCHEMA", "CONTEXTS", "HIGH", "LAYER", "LEARN", "LOW", "MODES", "RUN",
    "SEMANTIC", "ArmStats", "Bandit", "reward",
]

_fields = Fields(CalibrationError)  # field checks raising this package's error

LAYER = "layer"  # one cut or a chain: sequential fragments, exact
SEMANTIC = "semantic"  # parallel fragments, each a class group: sooner, less accurate
ARMS = (LAYER, SEMANTIC)  # ties go to the arm listed first
LOW = "low"  # deadline below the layer response estimate R: a layer split would likely miss it
HIGH = "high"  # deadline at or above R
CONTEXTS = (LOW, HIGH)
LEARN = "learn"  # ε-greedy with reward-feedback decay (SplitPlace Eq. 6-8)
RUN = "run"  # discounted UCB (SplitPlace Eq. 9, D-UCB)
MODES = (LEARN, RUN)

BANDIT_FILENAME = "bandit.json"
#: What load reads of a state: two arms by two contexts are a few hundred bytes; more is no state of ours.
MAX_STATE_BYTES = 1 << 20
BANDIT_SCHEMA = "splitedge.bandit/1"

SLA_WEIGHT = 0.5  # Eq. 3-4: deadline and accuracy weighted equally (the paper's grid search)
ACCURACY_FLOOR = 0.9  # the authors' code: accuracy counts only above 90 % ...
ACCURACY_SCALE = 10.0  # ... and (accuracy − 0.9)·10 maps 90-100 % onto 0-1
_EMPTY = 1e-12  # a discounted weight below this is an arm never played in the context


def reward(deadline_ms: float, response_ms: float, accuracy: float) -> float:
    """A finished frame's reward in [0, 1] (SplitPlace Eq. 3-4, one frame).

    ``0.5·[response ≤ deadline] + 0.5·clip((accuracy − 0.9)·10, 0, 1)``. Eq. 3 adds the plain
    accuracy p; the authors' code uses ``min(0, p − 0.9)·10``, a penalty of up to −9 that gives no
    credit above 90 %. Here the credit is ``max(0, p − 0.9)·10``: the two arms' accuracies differ
    by a few points above 90 %, which this term resolves where a plain p would not, and the
    reward stays in [0, 1], the range UCB's confidence bound (Hoeffding) assumes. ``accuracy`` is
    the arm's measured top-1 (the bundle's manifest) or the frame's own confidence.
    """
    _fields.number(deadline_ms, "deadline_ms")
    _fields.number(response_ms, "response_ms")
    accuracy = _fields.number(accuracy, "accuracy")
    if accuracy > 1.0:
        raise CalibrationError(f"accuracy: expected a fraction in [0, 1], got {accuracy!r}")
    met = 1.0 if response_ms <= deadline_ms else 0.0
    credit = min(1.0, max(0.0, (accuracy - ACCURACY_FLOOR) * ACCURACY_SCALE))
    return SLA_WEIGHT * met + (1.0 - SLA_WEIGHT) * credit


@dataclass(frozen=True)
class ArmStats:
    """One arm in one context: the plain count and mean (Eq. 5 with γ = 1/N, what ``learn``
    and :meth:`Bandit.describe` read) and the discounted weight and reward sum UCB reads."""

    count: int = 0
    mean: float = 0.0
    weight: float = 0.0  # Σ γ^(t−s) over this arm's observations s in the context
    weighted_sum: float = 0.0  # Σ γ^(t−s)·reward_s

    @property
    def discounted_mean(self) -> float:
        return self.weighted_sum / self.weight if self.weight > _EMPTY else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "weight": self.weight, "weighted_sum": self.weighted_sum}

    @classmethod
    def from_dict(cls, d: Any, path: str) -> ArmStats:
        d = _fields.obj(d, path)
        count = _fields.integer(_fields.member(d, "count", path), f"{path}.count", minimum=0)
        values = {name: _fields.number(_fields.member(d, name, path), f"{path}.{name}")
                  for name in ("mean", "weight", "weighted_sum")}
        if values["mean"] > 1.0 or values["weighted_sum"] > values["weight"] + 1e-9:
            raise CalibrationError(f"{path}: rewards are at most 1, got mean {values['mean']!r}, "
                                   f"weighted_sum {values['weighted_sum']!r} over weight {values['weight']!r}")
        return cls(count, **values)


class Bandit:
    """SplitPlace's per-frame choice between :data:`LAYER` and :data:`SEMANTIC` (module docstring).

    ``rng`` draws ε-greedy's coin and random arm; inject a seeded ``random.Random`` for
    reproducible runs (``run`` mode draws nothing).
    """

    def __init__(
        self, rng: random.Random | None = None, *, mode: str = LEARN, layer_ms: float | None = None,
        k: float = 0.1, interval: int = 10, phi: float = 0.1, c: float = 0.5, discount: float = 0.995,
    ) -> None:
        self._rng = rng if rng is not None else random.Random()
        self.mode = mode
        self._k = _fraction(k, "k", open_low=True)
        self._interval = _fields.integer(interval, "interval", minimum=1)
        self._phi = _fraction(phi, "phi", open_low=True)
        self._c = _fields.number(c, "c")
        self._discount = _fraction(discount, "discount", open_low=True)
        self._layer_ms = None if layer_ms is None else _fields.number(layer_ms, "layer_ms")
        self._epsilon = 1.0  # Eq. 6: every early choice is a coin toss
        self._rho = self._k  # Eq. 7-8: the reward threshold starts at k
        self._window_sum, self._window_count = 0.0, 0  # the current interval's rewards
        self._stats = {ctx: {arm: ArmStats() for arm in ARMS} for ctx in CONTEXTS}

    # --- what it knows -------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """``learn`` (ε-greedy) or ``run`` (UCB); settable: a board learns, then runs."""
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = _fields.choice(mode, "mode", MODES)

    @property
    def epsilon(self) -> float:
        return self._epsilon

    @property
    def threshold(self) -> float:
        """ρ of Eq. 7-8."""
        return self._rho

    @property
    def layer_ms(self) -> float | None:
        """R of Eq. 2, the layer split's response estimate; None before any estimate."""
        return self._layer_ms

    def stats(self, context: str, arm: str) -> ArmStats:
        return self._stats[_fields.choice(context, "context", CONTEXTS)][_fields.choice(arm, "arm", ARMS)]

    def context(self, deadline_ms: float) -> str:
        """:data:`LOW` when ``deadline_ms`` < R, else :data:`HIGH` (also while R is unknown)."""
        deadline_ms = _fields.number(deadline_ms, "deadline_ms")
        return LOW if self._layer_ms is not None and deadline_ms < self._layer_ms else HIGH

    # --- deciding and learning -----------------------------------------------------------

    def choose(self, deadline_ms: float, available: Collection[str] | None = None) -> str:
        """The arm for a frame (or a batch) due within ``deadline_ms``, among ``available``
        (default: both; an arm without hosts or without a bundle entry is left out)."""
        arms = _available(available)
        if len(arms) == 1:
            return arms[0]
        context = self.context(deadline_ms)
        if self._mode == LEARN and self._rng.random() < self._epsilon:
            return self._rng.choice(arms)
        return self._best(context, arms)

    def observe(
        self, arm: str, deadline_ms: float, response_ms: float, accuracy: float, context: str | None = None,
    ) -> float:
        """Take in a finished frame and return its :func:`reward`.

        ``context`` is the one :meth:`context` gave when the frame was chosen; without it, it is
        recomputed from ``deadline_ms`` before R takes in this response.
        """
        _fields.choice(arm, "arm", ARMS)
        context = self.context(deadline_ms) if context is None else _fields.choice(context, "context", CONTEXTS)
        value = reward(deadline_ms, response_ms, accuracy)
        stats = self._stats[context]
        for name, s in stats.items():  # D-UCB: one step of this context's clock ages both arms
            stats[name] = replace(s, weight=s.weight * self._discount, weighted_sum=s.weighted_sum * self._discount)
        s = stats[arm]
        count = s.count + 1
        stats[arm] = ArmStats(count, s.mean + (value - s.mean) / count, s.weight + 1.0, s.weighted_sum + value)
        if arm == LAYER:  # Eq. 2
            response_ms = float(response_ms)
            self._layer_ms = (response_ms if self._layer_ms is None
                              else self._phi * response_ms + (1.0 - self._phi) * self._layer_ms)
        if self._mode == LEARN:
            self._feedback(value)
        return value

    def _feedback(self, value: float) -> None:
        """Eq. 7-8 at the end of each interval of ``interval`` observations."""
        self._window_sum += value
        self._window_count += 1
        if self._window_count < self._interval:
            return
        if self._window_sum / self._window_count > self._rho:
            self._epsilon *= 1.0 - self._k
            self._rho = min(1.0, self._rho * (1.0 + self._k))
        self._window_sum, self._window_count = 0.0, 0

    def _best(self, context: str, arms: tuple[str, ...]) -> str:
        """``learn``: the best sample mean (Eq. 6); ``run``: the best discounted UCB (Eq. 9)."""
        stats = self._stats[context]
        if self._mode == LEARN:
            return max(arms, key=lambda a: (stats[a].mean, -ARMS.index(a)))
        for arm in arms:  # an arm this context never tried: its bound is infinite
            if stats[arm].weight <= _EMPTY:
                return arm
        total = sum(s.weight for s in stats.values())
        log_n = math.log(max(total, 1.0))

        def bound(a: str) -> tuple[float, int]:
            s = stats[a]
            return s.discounted_mean + self._c * math.sqrt(log_n / s.weight), -ARMS.index(a)

        return max(arms, key=bound)

    # --- showing and keeping -------------------------------------------------------------

    def describe(self) -> list[str]:
        """Lines for ``split-device plan``: per context each arm's count and mean reward, and the
        arm the bandit would take now (ε-greedy's greedy arm in ``learn``, UCB's in ``run``)."""
        r = "unknown" if self._layer_ms is None else f"{self._layer_ms:.1f} ms"
        lines = [f"split choice (SplitPlace bandit): mode {self._mode}, ε {self._epsilon:.3f} "
                 f"(reward threshold {self._rho:.3f}), layer response estimate {r}"]
        for context in CONTEXTS:
            relation = "<" if context == LOW else "≥"
            arms = "  ".join(f"{arm} n={s.count} mean {s.mean:.3f}" for arm, s in self._stats[context].items())
            lines.append(f"  {context:<4} (deadline {relation} estimate): {arms}  -> {self._best(context, ARMS)}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": BANDIT_SCHEMA,
            "mode": self._mode,
            "params": {"k": self._k, "interval": self._interval, "phi": self._phi, "c": self._c,
                       "discount": self._discount},
            "layer_ms": self._layer_ms,
            "epsilon": self._epsilon,
            "threshold": self._rho,
            "window": {"sum": self._window_sum, "count": self._window_count},
            "contexts": {ctx: {arm: s.to_dict() for arm, s in arms.items()} for ctx, arms in self._stats.items()},
        }

    @classmethod
    def from_dict(cls, d: Any, rng: random.Random | None = None, source: str = BANDIT_FILENAME) -> Bandit:
        """Read :meth:`to_dict`'s output; an error names the field under ``source``."""
        with _fields.located(f"{source}:"):
            return cls._from_dict(d, rng)

    @classmethod
    def _from_dict(cls, d: Any, rng: random.Random | None) -> Bandit:
        d = _fields.obj(d, "bandit")
        schema = _fields.member(d, "schema", "bandit")
        if schema != BANDIT_SCHEMA:
            raise CalibrationError(f"schema: expected {BANDIT_SCHEMA}, got {shown(schema)}")
        params = _fields.obj(_fields.member(d, "params", "bandit"), "params")
        args = {name: _fields.member(params, name, "params") for name in ("k", "interval", "phi", "c", "discount")}
        layer_ms = _fields.member(d, "layer_ms", "bandit")
        with _fields.located("params"):
            bandit = cls(rng, mode=LEARN, **args)
        if layer_ms is not None:
            bandit._layer_ms = _fields.number(layer_ms, "layer_ms")
        bandit.mode = _fields.member(d, "mode", "bandit")
        bandit._epsilon = _fraction(_fields.member(d, "epsilon", "bandit"), "epsilon")
        bandit._rho = _fields.number(_fields.member(d, "threshold", "bandit"), "threshold")
        window = _fields.obj(_fields.member(d, "window", "bandit"), "window")
        bandit._window_sum = _fields.number(_fields.member(window, "sum", "window"), "window.sum")
        bandit._window_count = _fields.integer(_fields.member(window, "count", "window"), "window.count", minimum=0)
        contexts = _fields.obj(_fields.member(d, "contexts", "bandit"), "contexts")
        for ctx in CONTEXTS:
            arms = _fields.obj(_fields.member(contexts, ctx, "contexts"), f"contexts.{ctx}")
            for arm in ARMS:
                path = f"contexts.{ctx}.{arm}"
                bandit._stats[ctx][arm] = ArmStats.from_dict(_fields.member(arms, arm, f"contexts.{ctx}"), path)
        return bandit

    def save(self, path: str | Path) -> Path:
        """Write the state to ``path`` (a file, or the directory holding ``calibration.json``)
        atomically: a board that loses power mid-write keeps the previous state. Returns the file."""
        path = _file(path)
        return write_atomically(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path, rng: random.Random | None = None) -> Bandit:
        """Read a state :meth:`save` wrote (``path``: the file or its directory)."""
        path = _file(path)
        try:
            data = json.loads(read_text_bounded(path, MAX_STATE_BYTES))  # a FIFO or /dev/zero is refused
        except FileNotFoundError:
            raise CalibrationError(f"{path}: no bandit state (it is written as the board learns)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CalibrationError(f"{path}: cannot read the bandit state: {exc}") from exc
        except (json.JSONDecodeError, RecursionError) as exc:
            raise CalibrationError(f"{path}: not valid JSON: {exc}") from exc
        return cls.from_dict(data, rng, source=str(path))


def _file(path: str | Path) -> Path:
    path = Path(path)
    return path / BANDIT_FILENAME if path.is_dir() else path


def _fraction(value: Any, path: str, open_low: bool = False) -> float:
    """A number in [0, 1] (in (0, 1] with ``open_low``: a rate of change that must move)."""
    number = _fields.number(value, path)
    if number > 1.0 or (open_low and number == 0.0):
        raise CalibrationError(f"{path}: expected a fraction in {'(' if open_low else '['}0, 1], got {value!r}")
    return number


def _available(available: Collection[str] | None) -> tuple[str, ...]:
    if available is None:
        return ARMS
    arms = tuple(a for a in ARMS if a in available)
    if not arms:
        raise CalibrationError(f"no arm available: expected some of {', '.join(ARMS)}, got {sorted(available)!r}")
    return arms

