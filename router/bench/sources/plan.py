"""What the draft-source benchmark sends (pure, deterministic): each family's variants and
their request bodies; the copy-heavy families' prompt is a 60-line function to rewrite with
one change (prompt lookup's case), also sent with the original as an OpenAI ``prediction``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EDIT_FAMILIES = ("edit", "refactor-with-prediction")
PREDICTION_FAMILY = EDIT_FAMILIES[1]
PLAIN = "plain"
# Sources named in the body (the speculative lane's ``draft_source`` request field).
BODY_SOURCES = ("prompt_lookup", "draft_model", "suffix")


def variants(family: str) -> tuple[str, ...]:
    """Plain decoding and the draft sources a family is measured with. A request with a
    ``prediction`` drafts from it whatever else it names: that family has two variants."""
    return (PLAIN, "prediction") if family == PREDICTION_FAMILY else (PLAIN, *BODY_SOURCES)


def apply_variant(body: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """The request body for one variant (``prediction``, ``forced``: the body as it is)."""
    if variant == PLAIN:
        return {**body, "num_draft_tokens": 0}
    if variant in BODY_SOURCES:
        return {**body, "draft_source": variant}
    return dict(body)


# The ``--scenarios``, each one client on the speculative lane. ``near-repeat``: a fresh name
# every round and the suffix variant first, so its index only holds other names' answers.
# ``tool-call``, ``json-schema``: plain constrained decoding against the grammar's forced
# tokens, a fresh subject every round and the forced variant first, so that no earlier answer
# to the same question can be drafted from.
SCENARIO_VARIANTS = {
    "repeat": (PLAIN, "suffix"),
    "near-repeat": ("suffix", PLAIN),
    "tool-call": ("forced", PLAIN),
    "json-schema": ("forced", PLAIN),
}


def _object(**properties: Any) -> dict[str, Any]:
    """A JSON schema object whose every property is required."""
    return {"type": "object", "properties": properties, "required": list(properties)}


STRING, INTEGER = {"type": "string"}, {"type": "integer"}
UNIT = {"enum": ["celsius", "fahrenheit"]}
WEATHER = _object(city=STRING, country=STRING, unit=UNIT, days=INTEGER)
PERSON = _object(
    first_name=STRING,
    last_name=STRING,
    age=INTEGER,
    city=STRING,
    occupation=STRING,
    languages={"type": "array", "items": STRING},
)
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
# Constrained answers: the prompt with a subject, and the body fields held to a grammar.
CONSTRAINED: dict[str, tuple[str, dict[str, Any]]] = {
    "tool-call": (
        "What will the weather be in {subject} over the next 3 days in celsius?",
        {"tools": [WEATHER_TOOL], "tool_choice": "required"},
    ),
    "json-schema": ("Describe {subject} as a JSON object.", {"response_format": PERSON_FORMAT}),
}
# Enough subjects that a family's routed run (a few dozen requests) never asks the same
# question twice: an earlier answer to the same question would be drafted whole.
SUBJECTS = {
    "tool-call": (
        "Lyon, France; Porto, Portugal; Graz, Austria; Turku, Finland; Ghent, Belgium; "
        "Bergen, Norway; Kraków, Poland; Seville, Spain; Leipzig, Germany; Bologna, Italy; "
        "Utrecht, Netherlands; Brno, Czechia; Cork, Ireland; Aarhus, Denmark; Basel, "
        "Switzerland; Tartu, Estonia; Pécs, Hungary; Split, Croatia; Cluj, Romania; Kaunas, "
        "Lithuania; Malmö, Sweden; Nantes, France; Braga, Portugal; Linz, Austria; Oulu, "
        "Finland; Bruges, Belgium; Tromsø, Norway; Gdańsk, Poland; Valencia, Spain; Dresden, "
        "Germany; Verona, Italy; Leiden, Netherlands"
    ).split("; "),
    "json-schema": (
        "Ada Lovelace; Alan Turing; Grace Hopper; Marie Curie; Isaac Newton; Emmy Noether; "
        "Nikola Tesla; Rosalind Franklin; Charles Darwin; Katherine Johnson; Leonhard Euler; "
        "Lise Meitner; Carl Gauss; Hedy Lamarr; Niels Bohr; Barbara McClintock; Blaise Pascal; "
        "Dorothy Hodgkin; Max Planck; Sophie Germain; Galileo Galilei; Mary Somerville; "
        "Johannes Kepler; Chien-Shiung Wu; Michael Faraday; Caroline Herschel; Enrico Fermi; "
        "Ida Noddack; James Maxwell; Maria Agnesi; Alfred Wegener; Edith Clarke"
    ).split("; "),
}


def constrained_request(name: str, round_: int = 0) -> tuple[str, dict[str, Any]]:
    """The prompt (its ``round_``-th subject, cycling) and the constraining body fields."""
    template, fields = CONSTRAINED[name]
    subjects = SUBJECTS[name]
    return template.format(subject=subjects[round_ % len(subjects)]), fields


REGIONS = ("north", "south", "east", "west", "online", "retail", "export", "partner")
FUNCTION_HEAD = '''def summarize_orders(orders, currency="EUR", limit=10):
    """Summarize a list of orders: totals per customer and the largest orders."""
    totals = {}
    counts = {}
    largest = []
    skipped = 0
    for order in orders:
        if order.get("currency") != currency:
            skipped += 1
            continue
        customer = order["customer"]
        amount = float(order["amount"])
        totals[customer] = totals.get(customer, 0.0) + amount
        counts[customer] = counts.get(customer, 0) + 1
        largest.append((amount, order["id"]))
'''
FUNCTION_REGION = """    {name}_orders = [o for o in orders if o.get("region") == "{name}"]
    {name}_total = sum(float(o["amount"]) for o in {name}_orders)
    report_region("{name}", len({name}_orders), {name}_total, rank={rank})
    log.debug("region %s: %d orders, %.2f", "{name}", len({name}_orders), {name}_total)
"""
FUNCTION_TAIL = """    largest.sort(reverse=True)
    top = [order_id for _, order_id in largest[:limit]]
    average = sum(totals.values()) / max(len(totals), 1)
    return {
        "currency": currency,
        "totals": totals,
        "counts": counts,
        "top": top,
        "average": average,
    }
"""


def function_60() -> str:
    """A plausible 60-line Python function (the same text every run)."""
    regions = (FUNCTION_REGION.format(name=n, rank=i + 1) for i, n in enumerate(REGIONS))
    padding = "    # keep the running totals in the order currency\n" * 3
    return FUNCTION_HEAD + padding + "".join(regions) + FUNCTION_TAIL


INSTRUCTION = (
    "Rewrite the following Python function with one change: rename it to "
    "`summarize_sales`. Output the complete function and nothing else.\n\n"
    "```python\n{code}```"
)
# The answer's first line, written for the model: a 135M model asked to rewrite a function
# tends to describe it instead; started on the new first line, it copies the rest, which is
# the copy-heavy answer this family is about. ChatML, the default model's template.
CHATML = "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{start}"
ANSWER_START = '```python\ndef summarize_sales(orders, currency="EUR", limit=10):\n'


def edit_body(family: str) -> dict[str, Any]:
    """The completions body fields of an edit family's request: the prompt, and for the
    prediction family the original function as the prediction."""
    code = function_60()
    prompt = CHATML.format(user=INSTRUCTION.format(code=code), start=ANSWER_START)
    body: dict[str, Any] = {"prompt": prompt}
    if family == PREDICTION_FAMILY:
        body["prediction"] = {"type": "content", "content": code + "```"}
    return body
