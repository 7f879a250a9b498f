"""Classify one request: pure, (request facts, policy, presets, backend snapshot, load gate,
speculative state) -> ``Classification`` (ordered candidates, reason, body changes), or a
``RouterError``.

Two calls, with the speculative state between them as values: ``resolve`` (steps 1 to 5)
names the model, the workload and the draft sources to ask auto-disable about; the proxy's
owner of the speculation decision (``router.proxy.speculation``) reads their state; ``route``
(steps 6 and 7) orders the candidates with that advice. ``classify`` is both for one advice.

The steps, in order (the first failing step answers):

1. Model: a policy alias is resolved; a name that no backend serves as-is but ends in
   ``@<preset>`` has the suffix taken as the preset hint (``qwen@interactive``). A name that
   is served as-is is never split, so LM Studio's ``model@q4_k_m`` ids pass through.
2. Preset: the ``X-Speclane-Preset`` header, else the model suffix, else the policy's
   ``default_preset``, else none. Unknown: 400 naming the configured presets; not in the
   policy's ``presets``: 403.
3. Model allowed by the policy (``models.allow``), else 403.
4. Body changes (chat and completions only): the preset's ``defaults`` for fields the
   request did not set, then the policy's caps (clamp, or 400 with ``action = "reject"``).
5. Backends serving the model (embeddings: external backends only; the MLX lanes do not
   embed). None: 404.
6. ``X-Speclane-Lane: auto | speculative | batching | <backend name>``: when the policy
   allows overrides, the named target is the only candidate, whatever the rules below say;
   not allowed: 403; not a lane or configured backend: 400; not serving the model: 400;
   down or cooling down: 503.
7. The lane preference: the policy's ``lanes[preset]``, else the preset's ``lane``, else
   ``auto``. ``batching``: the batching lane first. ``speculative`` and ``auto``: the
   speculative lane first unless one of these rules sends the request to batching (the
   first that applies names the reason):

   - ``n>1``: the speculative lane decodes one sequence at a time; batching decodes the
     n choices together.
   - ``long-prompt`` (more than ``long_prompt_chars``): prefill dominates and speculation
     only speeds decoding, while the draft model must prefill the prompt too.
   - ``high-temperature`` (above ``spec_max_temperature``): draft and target sample
     different tokens, acceptance collapses, and speculation costs more than it saves.
   - ``short-output`` (``max_tokens`` at most ``short_output_tokens``): too few tokens
     for the draft to win back its prefill.
   - ``spec-inactive``: the lane reports no active speculation (e.g. no draft loaded).
   - ``spec-not-paying``: the per-workload speculative state says it does not pay (a
     probe request still goes: ``spec-probe``). The state is kept per request family
     (``router.speculation.families``), so one client's edits and chat are judged apart.
   - ``spec-lane-busy``: the lane is at capacity (default 1): a request never waits
     behind another on the speculative lane while the batching lane can start it now.
   - ``low-priority``: a sheddable client (priority < 0) and the lanes are not idle.
   - ``load-high``: the load gate (``router.routing.load.LoadGate``) is busy; a client with
     priority > 0 passes it.

   A request with an OpenAI ``prediction`` that passes these rules takes the speculative lane
   under the rule ``prediction`` (the lane drafts from the prediction, even when it has no
   draft model, so ``spec-inactive`` does not apply to it).
   Then ``cache-affinity`` (``router.routing.affinity``): when the request's prefix was
   last served by the other lane (``RequestFacts.cache_holder``), that lane goes first
   unless load is imbalanced against it beyond ``affinity_abs_threshold`` and
   ``affinity_rel_threshold``; only over a rule that chose by load alone
   (``AFFINITY_MAY_OVERRULE``), never over a request-shape or speculation rule. Not when the
   lanes share one prompt cache (the shared layout): the reason then ends ``,cache=shared``.
   Then ``faster-lane`` (``router.routing.pace``): when affinity put the holder first, the
   turn goes to the load rules' choice after all if the lanes' measured pace says it
   finishes there sooner by more than ``pace_margin`` (``routing.pace_placement``).

   A lane that is down or cooling down is never a candidate: ``spec-lane-down`` /
   ``no-spec-lane`` send to batching, ``batching-down`` / ``no-batching-lane`` to the
   speculative lane. A model only external backends serve goes least busy first
   (``external``). Other available lanes and backends that serve the model follow the
   first candidate as fallbacks, least busy first.

The reason reads ``preset=<name|none>,<rule>-><lane>`` (``override-><lane>`` for an
override), plus ``,cache=shared`` when the lanes share one prompt cache, ``,clamped=<field>``
when a cap lowered a value, or ``,max_tokens_cap=<n>`` when the policy's ``max_tokens`` cap
set the limit of a request that named none (an agent's guard against a looping model);
``labels["rule"]`` is
the bare rule, from the closed vocabulary ``RULES``, for metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.config.names import (
    LANE_HEADER,
    LANE_NAMES,
    PRESET_HEADER,
    LaneName,
)
from router.config.policies import Policy
from router.config.presets import LanePreference, PresetSpec
from router.config.routing import RoutingRules
from router.kernel.errors import RouterError, bad_request, not_found, unavailable
from router.routing.affinity import RULE as AFFINITY_RULE
from router.routing.affinity import one_cache, steer, thresholds_of
from router.routing.load import LoadGate, available, candidate_for, gate_for, lane_load, lanes_load
from router.routing.modelname import resolve_name
from router.routing.pace import RULE as PACE_RULE
from router.routing.pace import LaneLoad, Paces, Placed, Turn, compare
from router.routing.speculate import (
    EXTERNAL_SOURCE,
    SPECULATION_PAYS,
    SpecAdvice,
    advice_label,
    advice_rule,
    batch_request_sources,
    free_rule,
    lane_speculates,
    request_sources,
)
from router.routing.types import BackendView, Candidate, Decision, RouteRequest
from router.speculation.families import workload_key

__all__ = [
    "DEFAULT_RULES",
    "RULES",
    "SPECULATION_PAYS",
    "Advised",
    "Classification",
    "RequestFacts",
    "Resolved",
    "RoutingRules",
    "SpecAdvice",
    "classify",
    "log_line",
    "resolve",
    "resolve_model",
    "route",
]

SHAPE_RULES = ("n>1", "long-prompt", "high-temperature", "short-output")
RULES = (
    "override",
    "spec-lane-free",
    "prediction",
    "spec-probe",
    "prefer-batching",
    "external",
    *SHAPE_RULES,
    "spec-inactive",
    "spec-not-paying",
    "spec-lane-busy",
    "low-priority",
    "load-high",
    "spec-lane-down",
    "no-spec-lane",
    "batching-down",
    "no-batching-lane",
    AFFINITY_RULE,
    PACE_RULE,
)


DEFAULT_RULES = RoutingRules()
# The rules that chose a lane for load alone: the only ones a cached prefix may overrule. A
# request-shape or speculation rule (n>1, long-prompt, spec-not-paying, spec-probe, ...) or a
# preference says the other lane is wrong for this request, whatever it holds.
AFFINITY_MAY_OVERRULE = frozenset({"spec-lane-free", "spec-lane-busy", "load-high", "low-priority"})


@dataclass(frozen=True, slots=True)
class RequestFacts:
    request: RouteRequest
    preset_header: str | None = None  # X-Speclane-Preset
    lane_header: str | None = None  # X-Speclane-Lane
    body_keys: frozenset[str] = frozenset()  # top-level fields present in the JSON body
    cache_holder: str | None = None  # the lane that last served this request's prefix


@dataclass(frozen=True, slots=True)
class Classification:
    decision: Decision
    client: str
    preset: str | None
    workload: str  # "<client>:<preset or none>:<family>", the speculative-state key
    model: str  # alias and preset suffix resolved
    body_changes: dict[str, Any] = field(default_factory=dict)  # set these body fields
    gate: LoadGate = field(default_factory=LoadGate)  # keep for the next decision


# Resolved and Advised are made on every request and never changed: not frozen, as a frozen
# dataclass pays a call of object.__setattr__ per field (measured: +10 k instructions per
# request for these two, under examples/count_instructions.py).


@dataclass(slots=True)
class Resolved:
    """A request resolved (``resolve``): what routing it needs, and what auto-disable is to be
    asked about before it is routed (``workload``, ``spec_sources``, ``batch_sources``)."""

    facts: RequestFacts
    policy: Policy
    backends: Sequence[BackendView]
    serving: Sequence[BackendView]  # the backends that serve the model (and endpoint)
    model: str  # alias and preset suffix resolved
    preset: str | None
    preset_source: str
    lane_pref: LanePreference
    workload: str
    # The speculative lane's sources in order of preference (an external backend's draft
    # model without one), never empty; the batching lane's, None without that lane.
    spec_sources: tuple[str, ...]
    batch_sources: tuple[str, ...] | None
    changes: dict[str, Any]
    clamped: tuple[str, ...]
    filled: int | None


@dataclass(slots=True)
class Advised:
    """What auto-disable says for one resolved request, as values: the speculative lane's
    source and its advice, and the batching lane's (None: not judged there)."""

    source: str
    advice: SpecAdvice = SPECULATION_PAYS
    batching: tuple[str, SpecAdvice] | None = None


@dataclass(frozen=True, slots=True)
class _Shape:
    n: int
    temperature: float | None
    max_tokens: int | None
    prompt_chars: int
    family: str = "chat"


def classify(
    facts: RequestFacts,
    policy: Policy,
    presets: Mapping[str, PresetSpec],
    backends: Sequence[BackendView],
    *,
    gate: LoadGate | None = None,
    rules: RoutingRules = DEFAULT_RULES,
    advice: SpecAdvice = SPECULATION_PAYS,
    batch_advice: SpecAdvice | None = None,
    paces: Paces | None = None,
) -> Classification:
    """``resolve`` then ``route`` with one advice for every source (``batch_advice``: the
    batching lane's, None: not judged there): the pipeline's steps in one call."""
    resolved = resolve(facts, policy, presets, backends)
    batch = None
    if batch_advice is not None and resolved.batch_sources:
        batch = (resolved.batch_sources[0], batch_advice)
    advised = Advised(resolved.spec_sources[0], advice, batch)
    return route(resolved, advised, gate=gate, rules=rules, paces=paces)


def resolve(
    facts: RequestFacts,
    policy: Policy,
    presets: Mapping[str, PresetSpec],
    backends: Sequence[BackendView],
) -> Resolved:
    """Steps 1 to 5: the model, the preset, the body changes and who serves it; and what
    auto-disable is to be asked about (the workload, the sources in order of preference)."""
    request = facts.request
    model, suffix = resolve_model(request.model, policy, backends)
    preset, preset_source = _choose_preset(facts.preset_header, suffix, policy, presets)
    if not policy.allows_model(model):
        raise RouterError(
            403,
            f"client '{policy.client}' may not use model '{model}'",
            type="permission_error",
            param="model",
            code="model_not_allowed",
        )
    changes, clamped, filled = _body_changes(
        request, facts.body_keys, presets.get(preset or ""), policy
    )
    if model != request.model:
        changes["model"] = model
    serving = [b for b in backends if model in b.models and _serves_endpoint(b, request)]
    if not serving:
        raise not_found(
            f"no backend serves model '{model}'"
            + (" for embeddings" if request.endpoint == "embeddings" else ""),
            param="model",
            code="model_not_found",
        )
    batching = _lane(serving, "batching")
    return Resolved(
        facts,
        policy,
        backends,
        serving,
        model,
        preset,
        preset_source,
        policy.lane_for(preset, presets),
        workload_key(policy.client, preset, request.family),
        _spec_sources(serving, request),
        None if batching is None else _batch_sources(batching, request),
        changes,
        clamped,
        filled,
    )


def route(
    resolved: Resolved,
    advised: Advised,
    *,
    gate: LoadGate | None = None,
    rules: RoutingRules = DEFAULT_RULES,
    paces: Paces | None = None,
) -> Classification:
    """Steps 6 and 7: the candidates in order and the rule that names the first, given what
    auto-disable said (``advised``), the load gate and the lanes' measured pace."""
    facts, policy, serving, model = (
        resolved.facts,
        resolved.policy,
        resolved.serving,
        resolved.model,
    )
    request, preset, pref = facts.request, resolved.preset, resolved.lane_pref
    load = lanes_load(resolved.backends)
    gate = (gate or gate_for(rules)).observe(load)
    source, advice = advised.source, advised.advice
    override = _override_target(facts.lane_header, policy, resolved.backends, model)
    pace_label = ""
    if override is not None:
        candidates, rule = _overridden(override, model, request), "override"
        reason = f"override->{candidates[0].lane}"
    else:
        shape = _shape(request, resolved.changes)
        candidates, rule = _route(serving, pref, shape, policy, gate, advice, load, rules)
        shared_cache = one_cache(serving)
        if rules.cache_affinity and rule in AFFINITY_MAY_OVERRULE and not shared_cache:
            chosen, rule = steer(
                candidates, rule, facts.cache_holder, serving, thresholds_of(rules)
            )
            if rule == AFFINITY_RULE and paces is not None and rules.pace_placement:
                placed = _placed(candidates[0], chosen[0], serving, shape, paces, rules)
                if placed is not None:
                    pace_label = placed.label()
                    if placed.moves:
                        chosen, rule = candidates, PACE_RULE
            candidates = chosen
        reason = f"preset={preset or 'none'},{rule}->{candidates[0].lane}"
        if shared_cache:
            reason += ",cache=shared"
    batching = _batch_candidate(serving, advised.batching)
    candidates = tuple(
        dataclasses.replace(c, source=source)
        if c.lane == "speculative"
        else batching
        if batching is not None and c.lane == "batching" and c.backend == batching.backend
        else c
        for c in candidates
    )
    if resolved.clamped:
        reason += ",clamped=" + "+".join(resolved.clamped)
    if resolved.filled is not None:
        reason += f",max_tokens_cap={resolved.filled}"
    labels = {
        "client": policy.client,
        "preset": preset or "none",
        "preset_source": resolved.preset_source,
        "lane_pref": pref,
        "rule": rule,
        "model": model,
        "requested_model": request.model,
        "lane_header": facts.lane_header or "",
        "lanes_load": str(load),
        "cache_holder": facts.cache_holder or "",
        "gate": "busy" if gate.busy else "free",
        "priority": str(policy.priority),
        "spec_advice": advice_label(advice),
        "spec_source": source,
        "clamped": ",".join(resolved.clamped),
        "pace": pace_label,
    }
    return Classification(
        Decision(candidates, reason, labels),
        policy.client,
        preset,
        resolved.workload,
        model,
        resolved.changes,
        gate,
    )


def resolve_model(
    requested: str, policy: Policy, backends: Sequence[BackendView]
) -> tuple[str, str | None]:
    """(model to use, preset suffix or None): aliases first, then ``model@preset``
    (``router.routing.modelname``); a name nothing serves is routed as the client's alias
    makes it (and found nowhere)."""
    served = {m for b in backends for m in b.models}
    aliases = policy.models.aliases
    found = resolve_name(requested, aliases, lambda name: name if name in served else None)
    if found is None:
        return aliases.get(requested, requested), None
    model, suffix = found
    return model, None if suffix is None else suffix.strip().lower()


def log_line(result: Classification) -> str:
    """The full inputs and outcome of one decision, for the debug log."""
    labels = " ".join(f"{k}={v!r}" for k, v in sorted(result.decision.labels.items()))
    candidates = ",".join(
        f"{c.backend}{'(spec)' if c.speculative else ''}" for c in result.decision.candidates
    )
    return (
        f"decision {result.decision.reason!r} candidates=[{candidates}] "
        f"workload={result.workload!r} changes={sorted(result.body_changes)} {labels}"
    )


def _choose_preset(
    header: str | None, suffix: str | None, policy: Policy, presets: Mapping[str, PresetSpec]
) -> tuple[str | None, str]:
    header = (header or "").strip().lower()
    if header:
        preset, source = header, "header"
    elif suffix:
        preset, source = suffix, "model-suffix"
    elif policy.default_preset:
        preset, source = policy.default_preset, "policy"
    else:
        return None, "none"
    if preset not in presets:
        known = ", ".join(sorted(presets)) or "(none configured)"
        where = {
            "header": PRESET_HEADER,
            "model-suffix": "the model suffix",
            "policy": f"policy '{policy.client}' default_preset",
        }[source]
        if source == "policy":
            raise RouterError(
                500,
                f"unknown preset '{preset}' in {where}; known presets: {known}",
                type="server_error",
                code="policy_error",
            )
        raise bad_request(
            f"unknown preset '{preset}' (from {where}); known presets: {known}",
            param="model" if source == "model-suffix" else None,
            code="unknown_preset",
        )
    if not policy.allows_preset(preset):
        raise RouterError(
            403,
            f"client '{policy.client}' may not use preset '{preset}' "
            f"(allowed: {', '.join(policy.presets)})",
            type="permission_error",
            code="preset_not_allowed",
        )
    return preset, source


def _is_set(key: str, request: RouteRequest, body_keys: frozenset[str]) -> bool:
    """Whether the client set ``key``; the parsed fields count too when keys are not given."""
    if key in body_keys:
        return True
    parsed = {
        "temperature": request.temperature is not None,
        "n": request.n != 1,
        "max_tokens": request.max_tokens is not None,
        "max_completion_tokens": request.max_tokens is not None,
    }
    return parsed.get(key, False)


def _body_changes(
    request: RouteRequest, body_keys: frozenset[str], preset: PresetSpec | None, policy: Policy
) -> tuple[dict[str, Any], tuple[str, ...], int | None]:
    """Preset defaults for unset fields, then the policy's caps: (changes, clamped field
    names, the max_tokens cap when it became the limit of a request that named none)."""
    filled = None
    if request.endpoint == "embeddings":
        return {}, (), None
    changes: dict[str, Any] = {}
    if preset is not None:
        changes = {k: v for k, v in preset.defaults.items() if not _is_set(k, request, body_keys)}
    caps, clamped = policy.caps, []
    token_key = "max_completion_tokens" if "max_completion_tokens" in body_keys else "max_tokens"
    if caps.max_tokens is not None:
        if request.max_tokens is not None:
            if _over_cap(policy, token_key, request.max_tokens, caps.max_tokens):
                changes[token_key] = caps.max_tokens
                clamped.append(token_key)
        else:  # a preset default above the cap, or none: the backend's default may be larger
            default = _int(changes.get(token_key))
            changes[token_key] = min(default, caps.max_tokens) if default else caps.max_tokens
            if changes[token_key] == caps.max_tokens:
                filled = caps.max_tokens
    if caps.n is not None:
        if _is_set("n", request, body_keys):
            if _over_cap(policy, "n", request.n, caps.n):
                changes["n"] = caps.n
                clamped.append("n")
        elif (_int(changes.get("n")) or 1) > caps.n:
            changes["n"] = caps.n
    return changes, tuple(clamped), filled


def _over_cap(policy: Policy, key: str, value: int, cap: int) -> bool:
    """True when the client's value must be clamped; raises 400 when the policy rejects."""
    if value <= cap:
        return False
    if policy.caps.action == "reject":
        raise bad_request(
            f"{key} {value} exceeds the cap of {cap} for client '{policy.client}'",
            param=key,
            code="cap_exceeded",
        )
    return True


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _shape(request: RouteRequest, changes: Mapping[str, Any]) -> _Shape:
    """The request as the backend will see it, after defaults and caps."""
    temperature = request.temperature
    if temperature is None:
        default = changes.get("temperature")
        if isinstance(default, int | float) and not isinstance(default, bool):
            temperature = float(default)
    tokens = _int(changes.get("max_tokens", changes.get("max_completion_tokens")))
    return _Shape(
        n=_int(changes.get("n")) or request.n,
        temperature=temperature,
        max_tokens=tokens if tokens is not None else request.max_tokens,
        prompt_chars=request.prompt_chars,
        family=request.family,
    )


def _spec_sources(serving: Sequence[BackendView], request: RouteRequest) -> tuple[str, ...]:
    """The sources this request may draft with on the speculative lane, in order of
    preference (each an auto-disable key part, and what the router asks the lane for)."""
    lane = _lane(serving, "speculative")
    if lane is None:
        return (EXTERNAL_SOURCE,)
    return request_sources(
        request.family, request.draft_source, lane.source_setting or "auto", lane.has_draft
    )


def _batch_sources(lane: BackendView, request: RouteRequest) -> tuple[str, ...]:
    """The sources this request may draft with on the batching lane, in order of preference
    (judged by auto-disable for that lane, apart from the speculative lane)."""
    return batch_request_sources(
        request.family, request.draft_source, lane.source_setting or "auto"
    )


def _batch_candidate(
    serving: Sequence[BackendView], advised: tuple[str, SpecAdvice] | None
) -> Candidate | None:
    """The batching lane's candidate with its draft source and whether it drafts (what
    auto-disable said for the batching lane); None without either."""
    lane = _lane(serving, "batching")
    if lane is None or advised is None:
        return None
    source, advice = advised
    drafts = source != "none" and (advice.use or advice.probe)
    return Candidate(lane.name, "batching", drafts, source)


def _serves_endpoint(view: BackendView, request: RouteRequest) -> bool:
    return request.endpoint != "embeddings" or view.lane is None


def _override_target(
    header: str | None, policy: Policy, backends: Sequence[BackendView], model: str = ""
) -> BackendView | None:
    value = (header or "").strip()
    if not value or value.lower() == "auto":
        return None
    if not policy.allow_lane_override:
        raise RouterError(
            403,
            f"client '{policy.client}' may not choose the lane ({LANE_HEADER})",
            type="permission_error",
            code="lane_override_forbidden",
        )
    lane = value.lower()
    # Each model loaded on demand has its own lanes: the one serving the model first.
    ordered = sorted(backends, key=lambda v: model not in v.models)
    for view in ordered:
        if (view.lane is not None and view.lane == lane) or view.name == value:
            return view
    if lane in LANE_NAMES:
        raise bad_request(f"{LANE_HEADER}: lane '{lane}' is not configured", code="unknown_lane")
    known = ["auto", *sorted({v.lane or v.name for v in backends})]
    raise bad_request(
        f"{LANE_HEADER}: unknown lane or backend '{value}'; known: {', '.join(known)}",
        code="unknown_lane",
    )


def _overridden(target: BackendView, model: str, request: RouteRequest) -> tuple[Candidate, ...]:
    label = target.lane or target.name
    if not _serves_endpoint(target, request):
        raise bad_request(
            f"{LANE_HEADER}: lane '{label}' does not serve embeddings", code="lane_cannot_serve"
        )
    if model not in target.models:
        raise bad_request(
            f"{LANE_HEADER}: '{label}' does not serve model '{model}'",
            param="model",
            code="model_not_served",
        )
    if not available(target):
        state = "cooling down after failures" if target.ready else "down"
        raise unavailable(f"{LANE_HEADER}: '{label}' is {state}", code="backend_unavailable")
    return (candidate_for(target),)


def _route(
    serving: Sequence[BackendView],
    pref: LanePreference,
    shape: _Shape,
    policy: Policy,
    gate: LoadGate,
    advice: SpecAdvice,
    load: int,
    rules: RoutingRules,
) -> tuple[tuple[Candidate, ...], str]:
    usable = [b for b in serving if available(b)]
    if not usable:
        states = {"cooling down" if b.ready else "down" for b in serving}
        raise unavailable(
            f"every backend serving the model is {' or '.join(sorted(states))}",
            code="no_backend_available",
        )
    spec, batch = _lane(usable, "speculative"), _lane(usable, "batching")
    externals = sorted((b for b in usable if b.lane is None), key=_load_key)
    if spec is None and batch is None:
        return tuple(candidate_for(b) for b in externals), "external"
    predicted = shape.family == "prediction"
    if pref == "batching":
        first, rule = (batch, "prefer-batching") if batch else (spec, _missing(serving, "batching"))
    elif spec is None:
        first, rule = batch, _missing(serving, "speculative")
    elif batch is None:
        first, rule = spec, _missing(serving, "batching")
    else:
        blocker = _spec_blocker(spec, shape, policy, gate, advice, load, rules)
        first, rule = (batch, blocker) if blocker else (spec, free_rule(advice, predicted))
    assert first is not None  # at least one lane is usable here
    lanes = [first, *sorted((b for b in (spec, batch) if b and b is not first), key=_load_key)]
    return tuple(_lane_candidate(b, advice, predicted) for b in lanes) + tuple(
        candidate_for(b) for b in externals
    ), rule


def _spec_blocker(
    spec: BackendView,
    shape: _Shape,
    policy: Policy,
    gate: LoadGate,
    advice: SpecAdvice,
    load: int,
    rules: RoutingRules,
) -> str | None:
    """Why the speculative lane should not take this request, or None when it should."""
    if shape.n > 1:
        return "n>1"
    if rules.long_prompt_chars and shape.prompt_chars > rules.long_prompt_chars:
        return "long-prompt"
    if shape.temperature is not None and shape.temperature > rules.spec_max_temperature:
        return "high-temperature"
    if shape.max_tokens is not None and shape.max_tokens <= rules.short_output_tokens:
        return "short-output"
    if not spec.speculative and shape.family != "prediction":  # a prediction always drafts
        return "spec-inactive"
    if off := advice_rule(advice):
        return off
    if lane_load(spec) >= (spec.capacity or 1):
        return "spec-lane-busy"
    if policy.priority < 0 and load > 0:
        return "low-priority"
    if gate.busy and policy.priority <= 0:
        return "load-high"
    return None


def _placed(
    first: Candidate,
    holder: Candidate,
    serving: Sequence[BackendView],
    shape: _Shape,
    paces: Paces,
    rules: RoutingRules,
) -> Placed | None:
    """Affinity put the holder of the prefix before the load rules' first choice: what the
    turn is expected to cost on each (``router.routing.pace``)."""
    views: dict[str, BackendView] = {v.lane: v for v in serving if v.lane is not None}
    held, other = views.get(holder.lane), views.get(first.lane)
    if held is None or other is None:
        return None
    turn = Turn(shape.prompt_chars, paces.expected_output(shape.max_tokens))
    return compare(_lane_load(held), _lane_load(other), paces, turn, rules.pace_margin)


def _lane_load(view: BackendView) -> LaneLoad:
    return LaneLoad(view.lane or view.name, lane_load(view), view.capacity or 1)


def _missing(serving: Sequence[BackendView], lane: LaneName) -> str:
    present = _lane(serving, lane) is not None
    if lane == "speculative":
        return "spec-lane-down" if present else "no-spec-lane"
    return "batching-down" if present else "no-batching-lane"


def _lane(views: Sequence[BackendView], lane: LaneName) -> BackendView | None:
    for view in views:  # a loop, not next(genexpr): asked several times per request
        if view.lane == lane:
            return view
    return None


def _lane_candidate(view: BackendView, advice: SpecAdvice, predicted: bool) -> Candidate:
    candidate = candidate_for(view)
    if view.lane == "speculative":
        return Candidate(
            candidate.backend, candidate.lane, lane_speculates(view, advice, predicted)
        )
    return candidate


def _load_key(view: BackendView) -> tuple[int, str]:
    return (lane_load(view), view.name)
