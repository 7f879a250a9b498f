"""Turn speculation off per (backend, model, workload) when it does not pay, and back on
when probes say it does again (pure: the caller passes ``now`` and acts on the results).

The state machine, per key:

- **on**: every speculative result goes into the key's acceptance window and speed
  window. Once the acceptance window holds ``min_sample`` units, a windowed acceptance
  below ``off_threshold`` turns it **off** (``low_acceptance``). Once ``min_speed_samples``
  speculative speeds and as many baseline (non-speculative) speeds for the same model and
  workload are known, a median speculative speed below baseline x (1 + off_speed_margin)
  turns it off (``not_faster``). Baseline speeds come from ``record_baseline`` (the
  batching lane, or the speculative lane with ``num_draft_tokens: 0``); while on and
  without a baseline, ``verdict`` asks now and then for one request without speculation.
- **off**: requests go without speculation, except one probe at a time. The first probe is
  due ``probe_initial`` after the switch; a bad (or inconclusive) probe multiplies the
  spacing by ``probe_backoff`` up to ``probe_max``; after a good probe the next is due
  ``probe_min_spacing`` after it. Probe starts on one key are never closer than
  ``probe_min_spacing``. A probe is good when what turned the key off is measured on it and
  passes (its own acceptance >= ``on_threshold``, over at least ``probe_min_drafted``
  tokens; its decode speed >= baseline x (1 + on_speed_margin)) and nothing measured
  fails. ``probes_to_enable`` consecutive good probes turn the key **on** again
  (``probe_recovered``), with fresh windows seeded by those probes. A key turned off again
  within ``probe_max`` of coming back starts its probing where the last off period began,
  times the back-off, so a workload that keeps relapsing is probed less and less.

A key whose source is ``auto`` (the lane chooses the draft at every step, by measured cost
and acceptance) is judged by speed alone: a low acceptance of cheap drafts is the lane's
choice, not a failure; and it asks for no baseline sample (the lane decodes plainly where no
draft pays), so its speed is judged against the lane's plain traffic when there is some.

Hysteresis: acceptance strictly between ``off_threshold`` and ``on_threshold`` neither turns
a key off nor makes a probe good, so it changes nothing.

Claims: ``verdict`` hands out a probe (or a baseline sample) with a ticket and marks it
taken, so a second concurrent request on the same key is routed normally. The caller
passes the ticket back to ``record`` / ``record_baseline``, or to ``cancel`` when the
request produced nothing usable; a ticket not returned within ``probe_timeout`` lapses
(an inconclusive probe).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from router.config.speculation import SpecSettings
from router.speculation.keystate import KeyState, OffReason, SpecKey, State
from router.speculation.probes import ProbeOutcome
from router.speculation.record import Observation, SpecRecord, SpecResult
from router.speculation.window import AcceptanceWindow, BaselineSpeeds, SpeedWindow, WindowEntry

TransitionReason = Literal["low_acceptance", "not_faster", "probe_recovered"]
VerdictReason = Literal[
    "on", "auto_disable_off", "low_acceptance", "not_faster", "probe", "baseline_sample"
]


# The lanes' own choice (``draft_source`` ``auto``): the lane drafts at each step only what
# it measures to pay, so a low acceptance (cheap drafts that are kept less often) is its
# decision, not a failure; such a key is judged by speed alone.
LANE_CHOOSES = "auto"


def judges_acceptance(key: SpecKey) -> bool:
    """Whether acceptance turns ``key`` off (and back on): not where the lane chooses."""
    return key.source != LANE_CHOOSES


@dataclass(frozen=True, slots=True)
class Verdict:
    """How to route the next request of a key.

    ``use_speculation`` False with reason ``low_acceptance``/``not_faster``: the key is off.
    ``probe``: send this one through speculation to re-measure. ``baseline_sample``: send
    this one without speculation to measure the baseline. Both carry a ``ticket``.
    """

    use_speculation: bool
    probe: bool
    reason: VerdictReason
    ticket: int | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of state, to be logged once and counted by the caller."""

    key: SpecKey
    state: State
    reason: TransitionReason
    at: float
    figures: dict[str, float | int | None]

    def describe(self) -> str:
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items())
        where = "/".join(self.key)
        return f"speculation {self.state} for {where}: {self.reason} {shown}"


class AutoDisable:
    """Per-key speculation state. ``resolve`` gives a key's settings (a policy's overrides
    merged into the global ones); without it every key uses ``settings``."""

    def __init__(
        self, settings: SpecSettings, resolve: Callable[[SpecKey], SpecSettings] | None = None
    ) -> None:
        self._settings = settings
        self._resolve = resolve or (lambda key: settings)
        self._keys: OrderedDict[SpecKey, KeyState] = OrderedDict()
        self._baselines = BaselineSpeeds(settings.speed_window, 2 * settings.max_keys)
        self._tickets: dict[int, tuple[SpecKey, Literal["probe", "baseline"]]] = {}
        self._next_ticket = 1

    # --- the routing side -------------------------------------------------------------

    def verdict(self, key: SpecKey, now: float) -> Verdict:
        """Route the next request of ``key``; may hand out (and so take) a probe or a
        baseline sample, which the caller must pass back (record/record_baseline/cancel)."""
        st = self._state(key, now)
        s = st.settings
        if not s.enabled:
            return Verdict(True, False, "auto_disable_off")
        if st.state == "on":
            if self._baseline_due(key, st, now):
                st.baseline_ticket = self._issue(key, "baseline")
                st.baseline_asked_at = now
                return Verdict(False, False, "baseline_sample", st.baseline_ticket)
            return Verdict(True, False, "on")
        if st.probe.due(now):
            ticket = self._issue(key, "probe")
            st.probe.claim(ticket, now)
            return Verdict(True, True, "probe", ticket)
        return Verdict(False, False, st.off_reason or "low_acceptance")

    def peek(self, key: SpecKey, now: float) -> Verdict:
        """What ``verdict`` would say, without taking a probe or creating state."""
        st = self._keys.get(key)
        if st is None:
            return Verdict(True, False, "on" if self._settings.enabled else "auto_disable_off")
        self._expire(st, now)
        if not st.settings.enabled:
            return Verdict(True, False, "auto_disable_off")
        if st.state == "on":
            return Verdict(True, False, "on")
        due = st.probe.due(now)
        return Verdict(due, due, "probe" if due else st.off_reason or "low_acceptance")

    # --- the reporting side -----------------------------------------------------------

    def record(
        self,
        key: SpecKey,
        result: SpecResult | None,
        observation: Observation | None,
        now: float,
        ticket: int | None = None,
    ) -> list[Transition]:
        """A request of ``key`` that ran *with* speculation has finished.

        ``result`` is its parsed statistics (None, NotReported or Malformed when there are
        none: then only its speed counts). Predicted Outputs are not drafts and are ignored.
        """
        st = self._state(key, now)
        entry = _entry(result)
        tps = _speed(observation, st.settings)
        if ticket is not None and self._tickets.get(ticket) == (key, "probe"):
            del self._tickets[ticket]
            return self._resolve_probe(key, st, entry, tps, now)
        if st.state == "off" and st.settings.enabled:
            return []  # not our probe (a stale ticket or a routing race): not judged
        if entry is not None:
            st.acceptance.add(entry.drafted, entry.accepted, entry.steps)
        if tps is not None:
            st.speed.add(tps)
        if not st.settings.enabled:
            return []
        return self._judge(key, st, now)

    def record_baseline(
        self,
        model: str,
        workload: str,
        observation: Observation,
        now: float,
        ticket: int | None = None,
        lane: str | None = None,
    ) -> None:
        """A request of (model, workload) decoded *without* speculation on ``lane`` (a lane
        or a backend's name): its speed is the baseline speculation on that lane has to
        beat."""
        if ticket is not None:
            self._release_baseline(ticket)
        tps = _speed(observation, self._settings)
        if tps is None:
            return
        self._baselines.add(model, workload, tps, lane)

    def cancel(self, ticket: int, now: float) -> None:
        """A probe or baseline sample produced nothing usable (error, client gone, routed
        elsewhere). A probe counts as inconclusive."""
        claim = self._tickets.get(ticket)
        if claim is None:
            return
        key, what = claim
        if what == "baseline":
            self._release_baseline(ticket)
            return
        del self._tickets[ticket]
        st = self._keys.get(key)
        if st is not None:
            self._resolve_probe(key, st, None, None, now)

    # --- reading ------------------------------------------------------------------------

    def enabled(self, key: SpecKey) -> bool:
        st = self._keys.get(key)
        return st is None or st.state == "on" or not st.settings.enabled

    def acceptance(self, key: SpecKey) -> float | None:
        st = self._keys.get(key)
        return None if st is None else st.acceptance.figures().acceptance

    def keys(self) -> list[SpecKey]:
        return list(self._keys)

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """Every key's state, JSON-ready, for ``GET /admin/spec``."""
        rows = []
        for key, st in sorted(self._keys.items(), key=lambda item: item[0]):
            self._expire(st, now)
            rows.append(st.describe(now, *self._baseline(key, st.settings)))
        return rows

    def reconfigure(
        self, settings: SpecSettings, resolve: Callable[[SpecKey], SpecSettings] | None = None
    ) -> None:
        """New settings (a config or policy reload): states are kept, windows resized."""
        self._settings = settings
        self._resolve = resolve or (lambda key: settings)
        self._baselines.max_slots = 2 * settings.max_keys
        for key, st in self._keys.items():
            new = self._resolve(key)
            if new == st.settings:
                continue
            acceptance = AcceptanceWindow(new.window_size, new.window_unit)
            for e in st.acceptance.entries():
                acceptance.add(e.drafted, e.accepted, e.steps)
            speed = SpeedWindow(new.speed_window)
            for v in st.speed.values():
                speed.add(v)
            st.settings, st.acceptance, st.speed = new, acceptance, speed
            st.probe.resize(new)
        self._evict()

    # --- judging ------------------------------------------------------------------------

    def _judge(self, key: SpecKey, st: KeyState, now: float) -> list[Transition]:
        s = st.settings
        fig = st.acceptance.figures()
        rate = fig.acceptance
        judged = judges_acceptance(key)
        if judged and fig.units >= s.min_sample and rate is not None and rate < s.off_threshold:
            return [
                self._turn_off(
                    key,
                    st,
                    "low_acceptance",
                    now,
                    {
                        "acceptance": rate,
                        "threshold": s.off_threshold,
                        "drafted": fig.drafted,
                        "accepted": fig.accepted,
                        "window_units": fig.units,
                    },
                )
            ]
        spec = st.speed.median(s.min_speed_samples)
        base, _ = self._baseline(key, s)
        if spec is not None and base is not None and spec < base * (1 + s.off_speed_margin):
            return [
                self._turn_off(
                    key,
                    st,
                    "not_faster",
                    now,
                    {
                        "spec_tps": spec,
                        "baseline_tps": base,
                        "ratio": spec / base,
                        "margin": s.off_speed_margin,
                        "acceptance": rate,
                    },
                )
            ]
        return []

    def _judge_probe(
        self, key: SpecKey, st: KeyState, entry: WindowEntry | None, tps: float | None
    ) -> ProbeOutcome:
        s = st.settings
        acc_known = (
            judges_acceptance(key) and entry is not None and entry.drafted >= s.probe_min_drafted
        )
        acc_ok = (
            acc_known and entry is not None and (entry.accepted >= s.on_threshold * entry.drafted)
        )
        base, _ = self._baseline(key, s)
        speed_known = tps is not None and base is not None
        speed_ok = (
            speed_known
            and tps is not None
            and base is not None
            and (tps >= base * (1 + s.on_speed_margin))
        )
        if (acc_known and not acc_ok) or (speed_known and not speed_ok):
            return "bad"
        cause_measured = acc_known if st.off_reason == "low_acceptance" else speed_known
        return "good" if cause_measured else "inconclusive"

    def _resolve_probe(
        self,
        key: SpecKey,
        st: KeyState,
        entry: WindowEntry | None,
        tps: float | None,
        now: float,
    ) -> list[Transition]:
        s = st.settings
        outcome = self._judge_probe(key, st, entry, tps) if st.state == "off" else "inconclusive"
        st.probe.settle(s, outcome, now)
        if st.state == "on":
            st.probe.stop()
            return []
        if outcome == "good":
            st.good_streak += 1
            st.series.append((entry, tps))
            if st.good_streak >= s.probes_to_enable:
                return [self._turn_on(key, st, now)]
        elif outcome == "bad":
            st.good_streak = 0
            st.series.clear()
        return []

    def _turn_off(
        self,
        key: SpecKey,
        st: KeyState,
        reason: OffReason,
        now: float,
        figures: dict[str, float | int | None],
    ) -> Transition:
        s = st.settings
        relapse = st.last_enabled_at is not None and now - st.last_enabled_at < s.probe_max
        st.state, st.off_reason, st.since = "off", reason, now
        st.changes += 1
        st.good_streak = 0
        st.series.clear()
        if st.baseline_ticket is not None:
            self._release_baseline(st.baseline_ticket)
        st.probe.start(s, now, relapse)
        next_at = st.probe.next_at if st.probe.next_at is not None else now
        figures = {**figures, "next_probe_in": next_at - now}
        return Transition(key, "off", reason, now, figures)

    def _turn_on(self, key: SpecKey, st: KeyState, now: float) -> Transition:
        s = st.settings
        entries = [e for e, _ in st.series if e is not None]
        speeds = [v for _, v in st.series if v is not None]
        drafted = sum(e.drafted for e in entries)
        base, _ = self._baseline(key, s)
        figures: dict[str, float | int | None] = {
            "probes": len(st.series),
            "acceptance": sum(e.accepted for e in entries) / drafted if drafted else None,
            "spec_tps": sorted(speeds)[len(speeds) // 2] if speeds else None,
            "baseline_tps": base,
            "off_seconds": now - st.since,
        }
        st.acceptance.clear()
        st.speed.clear()
        for e in entries:
            st.acceptance.add(e.drafted, e.accepted, e.steps)
        for v in speeds:
            st.speed.add(v)
        st.state, st.off_reason, st.since = "on", None, now
        st.changes += 1
        st.last_enabled_at = now
        st.series.clear()
        st.good_streak = 0
        st.probe.stop()
        return Transition(key, "on", "probe_recovered", now, figures)

    # --- baselines ----------------------------------------------------------------------

    def _baseline(self, key: SpecKey, s: SpecSettings) -> tuple[float | None, str | None]:
        return self._baselines.median(key.model, key.workload, s.min_speed_samples, key.backend)

    def _baseline_due(self, key: SpecKey, st: KeyState, now: float) -> bool:
        s = st.settings
        if s.baseline_spacing <= 0 or st.baseline_ticket is not None:
            return False
        if not judges_acceptance(key):
            # The lane already decodes plainly wherever no draft pays; a whole request sent
            # plain to measure it would cost the client a turn. Plain traffic of the lane
            # (num_draft_tokens: 0, penalties) still gives the speed check its baseline.
            return False
        if len(st.speed) < s.min_speed_samples or self._baseline(key, s)[0] is not None:
            return False
        return st.baseline_asked_at is None or now - st.baseline_asked_at >= s.baseline_spacing

    def _release_baseline(self, ticket: int) -> None:
        claim = self._tickets.pop(ticket, None)
        if claim is not None and claim[1] == "baseline":
            st = self._keys.get(claim[0])
            if st is not None and st.baseline_ticket == ticket:
                st.baseline_ticket = None

    # --- bookkeeping --------------------------------------------------------------------

    def _state(self, key: SpecKey, now: float) -> KeyState:
        st = self._keys.get(key)
        if st is None:
            s = self._resolve(key)
            st = self._keys[key] = KeyState(
                key=key,
                settings=s,
                acceptance=AcceptanceWindow(s.window_size, s.window_unit),
                speed=SpeedWindow(s.speed_window),
                since=now,
            )
            self._evict(keep=key)
        self._keys.move_to_end(key)
        self._expire(st, now)
        return st

    def _evict(self, keep: SpecKey | None = None) -> None:
        """Forget keys past ``max_keys``: the least recently used quiet 'on' key first
        (forgetting it loses only figures), else the least recently used."""
        while len(self._keys) > self._settings.max_keys:
            candidates = [k for k in self._keys if k != keep]
            quiet = [k for k in candidates if self._is_quiet(self._keys[k])]
            victim = (quiet or candidates)[0]
            st = self._keys.pop(victim)
            for ticket in (st.probe.ticket, st.baseline_ticket):
                if ticket is not None:
                    self._tickets.pop(ticket, None)

    @staticmethod
    def _is_quiet(st: KeyState) -> bool:
        return st.state == "on" and st.probe.ticket is None and st.baseline_ticket is None

    def _expire(self, st: KeyState, now: float) -> None:
        """Claims not returned within ``probe_timeout`` lapse."""
        if st.probe.lapsed(st.settings, now) and st.probe.ticket is not None:
            self._tickets.pop(st.probe.ticket, None)
            self._resolve_probe(st.key, st, None, None, now)
        if (
            st.baseline_ticket is not None
            and st.baseline_asked_at is not None
            and (now - st.baseline_asked_at >= st.settings.probe_timeout)
        ):
            self._release_baseline(st.baseline_ticket)

    def _issue(self, key: SpecKey, what: Literal["probe", "baseline"]) -> int:
        ticket = self._next_ticket
        self._next_ticket += 1
        self._tickets[ticket] = (key, what)
        return ticket


def _entry(result: SpecResult | None) -> WindowEntry | None:
    if not isinstance(result, SpecRecord) or result.kind == "predicted_output":
        return None
    if result.drafted <= 0:
        return None
    return WindowEntry(result.drafted, result.accepted, result.steps)


def _speed(observation: Observation | None, s: SpecSettings) -> float | None:
    if observation is None or not observation.solo:
        return None
    return observation.decode_tps(s.min_decode_tokens)


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
