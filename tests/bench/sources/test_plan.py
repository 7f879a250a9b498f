"""What the draft-source benchmark sends: variants, and copy-heavy families that are what
they claim (pure)."""

from __future__ import annotations

from router.bench.sources import plan
from router.bench.sources.plan import ANSWER_START, edit_body, function_60
from router.speculation.families import classify_family


def test_the_function_has_60_lines_and_is_the_same_every_time() -> None:
    code = function_60()
    assert code.count("\n") == 60 and code == function_60()
    compile(code, "f.py", "exec")  # a real function, not line noise


def test_the_families_classify_as_their_names_promise() -> None:
    edit, predicted = edit_body("edit"), edit_body("refactor-with-prediction")
    assert classify_family(edit) == "code-block"
    assert classify_family(predicted) == "prediction"
    assert "prediction" not in edit
    assert predicted["prediction"]["content"].startswith(function_60())
    assert edit["prompt"].endswith(ANSWER_START)


def test_every_family_is_measured_against_plain_decoding() -> None:
    assert plan.variants("chat") == ("plain", "prompt_lookup", "draft_model", "suffix")
    assert plan.variants("edit") == ("plain", "prompt_lookup", "draft_model", "suffix")
    # A prediction wins over any named source on the lane, so that family has two variants.
    assert plan.variants("refactor-with-prediction") == ("plain", "prediction")


def test_variants_rewrite_a_copy_of_the_body() -> None:
    body = {"prompt": "x"}
    assert plan.apply_variant(body, "plain") == {"prompt": "x", "num_draft_tokens": 0}
    assert plan.apply_variant(body, "prompt_lookup") == {
        "prompt": "x",
        "draft_source": "prompt_lookup",
    }
    assert plan.apply_variant(body, "prediction") == body
    assert body == {"prompt": "x"}


def test_scenario_bodies() -> None:
    body = {"messages": []}
    assert plan.apply_variant(body, "forced") == body
    assert plan.apply_variant(body, "suffix") == {"messages": [], "draft_source": "suffix"}


def test_constrained_requests_are_the_constrained_family_with_a_fresh_subject() -> None:
    for name in plan.CONSTRAINED:
        prompts = set()
        for round_ in range(len(plan.SUBJECTS[name])):
            prompt, fields = plan.constrained_request(name, round_)
            body = {"messages": [{"role": "user", "content": prompt}], **fields}
            assert classify_family(body) == "constrained"
            prompts.add(prompt)
        assert len(prompts) == len(plan.SUBJECTS[name])  # no two rounds ask the same
        assert plan.constrained_request(name, 0) == plan.constrained_request(name)
        # the forced variant goes first: no plain answer to the same question to draft from
        assert plan.SCENARIO_VARIANTS[name] == ("forced", plan.PLAIN)
