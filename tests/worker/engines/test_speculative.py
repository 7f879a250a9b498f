"""The speculative lane's decode loop on a scripted model: acceptance, KV trimming, stops."""

from __future__ import annotations

import pytest

from router.worker.drafting.drafts import LookupConfig, PredictionConfig, PredictionDraft
from router.worker.engines.speculative import (
    MERGED_PROMPT_MAX,
    PREFILL_STEP,
    Plan,
    SpeculativeConfig,
    Step,
    decode,
    lookup_proposer,
    plan,
    prediction_proposer,
)
from router.worker.request.protocol import GenerationRequest
from tests.worker.scripted import ScriptedCache, ScriptedLM

EOS = 0x17F


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def greedy(logprobs):  # what make_sampler(temp=0) does
    import mlx.core as mx

    return mx.argmax(logprobs, axis=-1)


def run(prompt: str, answer: str, propose=None, k: int = 0, max_tokens: int = 200):
    model = ScriptedLM(ids(prompt + answer), EOS)
    history = ids(prompt)
    steps = list(
        decode(
            model,
            [ScriptedCache()],
            history,
            0,
            max_tokens=max_tokens,
            sampler=greedy,
            propose=propose,
            k=k,
            stop_tokens=frozenset({EOS}),
        )
    )
    out = [t for s in steps for t in s.tokens]
    return model, steps, out, history


PROMPT = "Rewrite:\ndef f(x):\n    return x + 1\n\ndef g(y):\n    return y * 2\n\nAnswer:\n"
ANSWER = "def f(x):\n    return x + 2\n\ndef g(y):\n    return y * 2\n"


def test_plain_decoding_feeds_one_token_per_pass() -> None:
    model, steps, out, history = run(PROMPT, ANSWER)
    assert out == [*ids(ANSWER), EOS]
    assert model.passes[1:] == [1] * len(out)  # after the one prefill pass
    assert all(s.drafted == 0 for s in steps)
    assert history == [*ids(PROMPT + ANSWER), EOS]


@pytest.mark.parametrize("source", ["prompt_lookup", "prediction"])
def test_drafting_changes_the_passes_not_the_output(source: str) -> None:
    if source == "prompt_lookup":
        propose = lookup_proposer(LookupConfig(2, 4, 8))
    else:
        original = ANSWER.replace("x + 2", "x + 1")
        propose = prediction_proposer(PredictionDraft(ids(original), PredictionConfig(2, 4, 8)))
    model, steps, out, _ = run(PROMPT, ANSWER, propose, k=8)
    assert out == [*ids(ANSWER), EOS]
    accepted = sum(s.accepted for s in steps)
    assert accepted >= len(ANSWER) // 2  # copied text came in runs
    assert len(model.passes) - 1 < len(out) // 2
    assert sum(s.drafted for s in steps) >= accepted


def test_rejected_drafts_are_trimmed_from_the_cache() -> None:
    # A prediction that is wrong everywhere: every pass is partly rejected, and the scripted
    # model raises if a rejected token were still in the cache at the next pass.
    # (Right for the first token, which goes out before any draft, wrong after it.)
    wrong = PredictionDraft(ids("a" + "z" * 31), PredictionConfig(1, 2, 4))
    _model, steps, out, _ = run("q", "abcabcabc", prediction_proposer(wrong), k=4)
    assert out == [*ids("abcabcabc"), EOS]
    assert steps[1].drafted == 4 and steps[1].accepted == 0


def test_the_first_token_goes_out_on_a_plain_pass() -> None:
    # Time to the first token is not spent verifying a draft: drafting starts with the second.
    propose = prediction_proposer(PredictionDraft(ids(ANSWER), PredictionConfig(2, 4, 8)))
    model, steps, out, _ = run(PROMPT, ANSWER, propose, k=8)
    assert out == [*ids(ANSWER), EOS]
    assert (steps[0].drafted, steps[0].tokens, model.passes[1]) == (0, ids(ANSWER)[:1], 1)
    assert steps[1].drafted == 8 and steps[1].accepted == 8


def test_max_tokens_caps_the_draft_and_the_output() -> None:
    propose = lookup_proposer(LookupConfig(2, 4, 8))
    for max_tokens in (1, 2, 5, 17):
        _, _steps, out, _ = run(PROMPT, ANSWER, propose, k=8, max_tokens=max_tokens)
        assert out == ids(ANSWER)[:max_tokens]


def test_eos_inside_an_accepted_run_ends_the_output_there() -> None:
    prediction = PredictionDraft([*ids("abc"), EOS, *ids("abc")], PredictionConfig(2, 4, 8))
    _, _steps, out, history = run("p", "abc", prediction_proposer(prediction), k=8)
    assert out == [*ids("abc"), EOS]
    assert history == [*ids("pabc"), EOS]


def test_the_cache_may_already_hold_a_prefix() -> None:
    model = ScriptedLM(ids(PROMPT + ANSWER), EOS)
    cache = ScriptedCache()
    model(__import__("mlx.core", fromlist=["array"]).array([ids(PROMPT[:10])]), cache=[cache])
    history = ids(PROMPT)
    out = [
        t
        for s in decode(model, [cache], history, 10, max_tokens=5, sampler=greedy)
        for t in s.tokens
    ]
    assert out == ids(ANSWER)[:5]
    with pytest.raises(ValueError):
        next(decode(model, [ScriptedCache()], ids("ab"), 2, max_tokens=5, sampler=greedy))


SETTINGS = SpeculativeConfig(draft_source="draft_model", num_draft_tokens=3)


@pytest.mark.parametrize(
    ("request_", "settings", "has_draft", "processors", "expected"),
    [
        (GenerationRequest("chat"), SETTINGS, True, False, Plan("draft_model", 3)),
        (
            GenerationRequest("chat", num_draft_tokens=2),
            SETTINGS,
            True,
            False,
            Plan("draft_model", 2),
        ),
        (
            GenerationRequest("chat", num_draft_tokens=10),
            SETTINGS,
            True,
            False,
            Plan("draft_model", 3),
        ),
        (GenerationRequest("chat", num_draft_tokens=0), SETTINGS, True, False, Plan(None, 0)),
        (GenerationRequest("chat"), SETTINGS, False, False, Plan(None, 0)),  # no draft loaded
        (
            GenerationRequest("chat"),
            SpeculativeConfig(draft_source="prompt_lookup"),
            False,
            False,
            Plan("prompt_lookup", 8),
        ),
        (
            GenerationRequest("chat"),
            SpeculativeConfig(draft_source="none"),
            True,
            False,
            Plan(None, 0),
        ),
        (
            GenerationRequest("chat"),
            SpeculativeConfig(draft_source="suffix"),
            False,
            False,
            Plan("suffix", 16),
        ),
        (
            GenerationRequest("chat", draft_source="suffix", num_draft_tokens=5),
            SETTINGS,
            True,
            False,
            Plan("suffix", 5),
        ),
        (
            GenerationRequest("chat", draft_source="suffix", prediction="x"),
            SETTINGS,
            True,
            False,
            Plan("prediction", 16),
        ),
        (GenerationRequest("chat", prediction="x"), SETTINGS, True, False, Plan("prediction", 16)),
        (
            GenerationRequest("chat", prediction="x", num_draft_tokens=4),
            SETTINGS,
            True,
            False,
            Plan("prediction", 4),
        ),
        # the request's own draft_source beats the lane's; a prediction still beats both
        (
            GenerationRequest("chat", draft_source="prompt_lookup"),
            SETTINGS,
            True,
            False,
            Plan("prompt_lookup", 8),
        ),
        (
            GenerationRequest("chat", draft_source="draft_model"),
            SpeculativeConfig(draft_source="prompt_lookup"),
            True,
            False,
            Plan("draft_model", 3),
        ),
        (
            GenerationRequest("chat", draft_source="prompt_lookup"),
            SpeculativeConfig(draft_source="none"),
            False,
            False,
            Plan("prompt_lookup", 8),
        ),
        (
            GenerationRequest("chat", draft_source="prompt_lookup", prediction="x"),
            SETTINGS,
            True,
            False,
            Plan("prediction", 16),
        ),
        (
            GenerationRequest("chat", draft_source="prompt_lookup", num_draft_tokens=0),
            SETTINGS,
            True,
            False,
            Plan(None, 0),
        ),
        (
            GenerationRequest("chat", draft_source="prompt_lookup"),
            SETTINGS,
            True,
            True,
            Plan(None, 0),
        ),
        # penalties, logit bias, constraints: plain decoding, whatever the source
        (GenerationRequest("chat", prediction="x"), SETTINGS, True, True, Plan(None, 0)),
        (
            GenerationRequest("chat"),
            SpeculativeConfig(draft_source="prompt_lookup"),
            False,
            True,
            Plan(None, 0),
        ),
    ],
)
def test_plan_picks_the_draft_source(request_, settings, has_draft, processors, expected) -> None:
    assert plan(request_, settings, has_draft, processors) == expected


@pytest.mark.parametrize(
    ("request_", "processors", "expected"),
    [
        # a constrained request drafts its forced tokens, beside its own source
        (GenerationRequest("chat"), False, Plan("draft_model", 3, forced=16)),
        (GenerationRequest("chat", draft_source="suffix"), False, Plan("suffix", 16, forced=16)),
        (GenerationRequest("chat", num_draft_tokens=2), False, Plan("draft_model", 2, forced=2)),
        # num_draft_tokens 0 is the plain baseline: no forced drafting either
        (GenerationRequest("chat", num_draft_tokens=0), False, Plan(None, 0)),
        # penalties or a logit bias beside the constraint: plain
        (GenerationRequest("chat"), True, Plan(None, 0)),
    ],
)
def test_plan_drafts_forced_tokens_of_a_constrained_request(request_, processors, expected) -> None:
    assert plan(request_, SETTINGS, True, processors, constrained=True) == expected
    if request_.draft_source is not None or not expected.forced:
        return
    no_source = plan(
        request_, SpeculativeConfig(draft_source="none"), False, processors, constrained=True
    )
    assert no_source.source is None and no_source.forced == expected.forced


def test_auto_choice_drafts_from_the_source_that_copies_and_stays_lossless() -> None:
    """A copying answer, two sources: lookup copies the prompt, the other proposes junk. The
    chooser ends up drafting from lookup, and the output is plain decoding's."""
    from router.worker.drafting.draftchoice import Chooser, DraftCandidate
    from router.worker.drafting.draftcontrol import PassCost

    prompt = PROMPT * 2
    model = ScriptedLM(ids(prompt + ANSWER), EOS)
    history = ids(prompt)
    lookup = lookup_proposer(LookupConfig(max_draft=8))
    prompt_len = len(history)
    junk = DraftCandidate("suffix", lambda h, k: [ord("#")] * k, 8)
    copy = DraftCandidate("prompt_lookup", lambda h, k: lookup(h, prompt_len, k), 8)
    chooser = Chooser([junk, copy], PassCost(0.1))
    steps = list(
        decode(
            model,
            [ScriptedCache()],
            history,
            0,
            max_tokens=200,
            sampler=greedy,
            stop_tokens=frozenset({EOS}),
            chooser=chooser,
        )
    )
    out = [t for s in steps for t in s.tokens]
    assert out == [*ids(ANSWER), EOS]
    tallies = chooser.tallies
    assert tallies["prompt_lookup"].accepted > len(ANSWER) // 2
    assert tallies.get("suffix") is None or tallies["suffix"].accepted == 0
    assert len(steps) < len(out) // 2  # far fewer passes than tokens


def test_a_short_prompt_goes_through_with_the_first_token_a_long_one_in_chunks() -> None:
    model, steps, out, _ = run("x" * (MERGED_PROMPT_MAX + 1), "ab")
    assert model.passes == [MERGED_PROMPT_MAX + 1, 1, 1]  # one pass fewer than prefilling
    prompt = "x" * (2 * PREFILL_STEP + 10)
    model, steps, out, history = run(prompt, "ab")
    assert out == [*ids("ab"), EOS]
    # Every chunk but the last a step of its own (a point to cancel); the logits of a pass
    # are computed at every position it feeds, so a long prompt's first pass is one token.
    assert model.passes == [PREFILL_STEP, PREFILL_STEP, 9, 1, 1, 1]
    assert [s.tokens for s in steps[:3]] == [[], [], ids("a")]
    assert history == [*ids(prompt + "ab"), EOS]


def test_logprobs_are_the_targets_at_every_emitted_position_drafted_or_not() -> None:
    """Each emitted token's entry is the target's distribution at the position that emitted
    it: the same with drafts (verified positions) as with plain decoding, row for row."""
    import math

    vocab = 0x180

    def peak(position: int) -> float:  # a different distribution after every position
        return 4.0 + position % 7

    def expected(position: int) -> float:
        p = peak(position)
        return p - math.log(math.exp(p) + vocab - 1)

    def decoded(propose=None, k: int = 0) -> list[Step]:
        model = ScriptedLM(ids(PROMPT + ANSWER), EOS, vocab, peak=peak)
        return list(
            decode(
                model,
                [ScriptedCache()],
                ids(PROMPT),
                0,
                max_tokens=200,
                sampler=greedy,
                propose=propose,
                k=k,
                stop_tokens=frozenset({EOS}),
                top_logprobs=2,
            )
        )

    plain = decoded()
    drafted = decoded(lookup_proposer(LookupConfig(2, 4, 8)), k=8)
    assert sum(s.accepted for s in drafted) > 0
    for steps in (plain, drafted):
        entries = [e for s in steps for e in s.logprobs or []]
        tokens = [t for s in steps for t in s.tokens]
        assert len(entries) == len(tokens) == len(ANSWER) + 1
        for i, ((logprob, top), token) in enumerate(zip(entries, tokens, strict=True)):
            position = len(PROMPT) + i - 1  # the position whose logits emitted it
            assert logprob == pytest.approx(expected(position), abs=1e-4)
            assert top[0][0] == token and top[0][1] == pytest.approx(logprob, abs=1e-6)
            assert len(top) == 2 and top[1][1] < top[0][1]
    assert all(s.logprobs is None for s in run(PROMPT, ANSWER)[1])  # not asked: none
