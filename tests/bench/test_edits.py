"""The copy-heavy benchmark families are what they claim (pure)."""

from __future__ import annotations

from router.bench.edits import ANSWER_START, edit_body, function_60
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
