"""What the draft-source benchmark sends (pure, deterministic): each family's variants and
the request body of each, and the copy-heavy families' prompt, a 60-line function to
rewrite with one change (prompt lookup's case), also sent with the original as an OpenAI
``prediction`` (Predicted Outputs' case)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EDIT_FAMILIES = ("edit", "refactor-with-prediction")
PLAIN = "plain"
# Sources named in the body (the speculative lane's ``draft_source`` request field).
BODY_SOURCES = ("prompt_lookup", "draft_model", "suffix")
PREDICTION_FAMILY = EDIT_FAMILIES[1]


def variants(family: str) -> tuple[str, ...]:
    """Plain decoding and the draft sources a family is measured with. A request that
    carries a ``prediction`` drafts from it whatever else it names, so the prediction family
    is measured against plain decoding only (its other sources are the ``edit`` family)."""
    if family == PREDICTION_FAMILY:
        return (PLAIN, "prediction")
    return (PLAIN, *BODY_SOURCES)


def apply_variant(body: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """The request body for one variant (``prediction``: the body already carries it)."""
    out = dict(body)
    if variant == PLAIN:
        out["num_draft_tokens"] = 0
    elif variant in BODY_SOURCES:
        out["draft_source"] = variant
    return out


# Cross-request and constrained scenarios (``--scenarios``): one client, the speculative lane.
# ``repeat``: the same prompt again; ``near-repeat``: the same task with one name changed (a
# fresh name every round, the suffix variant first, so its index only holds other names'
# answers); ``tool-call`` and ``json-schema``: constrained answers, plain constrained decoding
# against what the router picks (the grammar's forced tokens, and the source of the
# ``constrained`` family between them), a fresh subject every round and the forced variant
# first, so no earlier answer to the same question can be drafted from.
SCENARIO_VARIANTS = {
    "repeat": (PLAIN, "suffix"),
    "near-repeat": ("suffix", PLAIN),
    "tool-call": ("forced", PLAIN),
    "json-schema": ("forced", PLAIN),
}


def scenario_body(body: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """``forced``: the body as it is (a constrained request drafts its forced tokens)."""
    return dict(body) if variant == "forced" else apply_variant(body, variant)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "country": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city", "country", "unit", "days"],
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {
        "first_name": {"type": "string"},
        "last_name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "occupation": {"type": "string"},
        "languages": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["first_name", "last_name", "age", "city", "occupation", "languages"],
}
# Constrained answers (scenarios, and families of the routed run): the prompt with a subject,
# and the body fields that hold the answer to a grammar.
CONSTRAINED: dict[str, tuple[str, dict[str, Any]]] = {
    "tool-call": (
        "What will the weather be in {subject} over the next 3 days in celsius?",
        {"tools": [WEATHER], "tool_choice": "required"},
    ),
    "json-schema": (
        "Describe {subject} as a JSON object.",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON},
            }
        },
    ),
}
# Enough subjects that a family's routed run (a few dozen requests) never asks the same
# question twice: an earlier answer to the same question would be drafted whole.
SUBJECTS = {
    "tool-call": (
        "Lyon, France",
        "Porto, Portugal",
        "Graz, Austria",
        "Turku, Finland",
        "Ghent, Belgium",
        "Bergen, Norway",
        "Kraków, Poland",
        "Seville, Spain",
        "Leipzig, Germany",
        "Bologna, Italy",
        "Utrecht, Netherlands",
        "Brno, Czechia",
        "Cork, Ireland",
        "Aarhus, Denmark",
        "Basel, Switzerland",
        "Tartu, Estonia",
        "Pécs, Hungary",
        "Split, Croatia",
        "Cluj, Romania",
        "Kaunas, Lithuania",
        "Malmö, Sweden",
        "Nantes, France",
        "Braga, Portugal",
        "Linz, Austria",
        "Oulu, Finland",
        "Bruges, Belgium",
        "Tromsø, Norway",
        "Gdańsk, Poland",
        "Valencia, Spain",
        "Dresden, Germany",
        "Verona, Italy",
        "Leiden, Netherlands",
    ),
    "json-schema": (
        "Ada Lovelace",
        "Alan Turing",
        "Grace Hopper",
        "Marie Curie",
        "Isaac Newton",
        "Emmy Noether",
        "Nikola Tesla",
        "Rosalind Franklin",
        "Charles Darwin",
        "Katherine Johnson",
        "Leonhard Euler",
        "Lise Meitner",
        "Carl Gauss",
        "Hedy Lamarr",
        "Niels Bohr",
        "Barbara McClintock",
        "Blaise Pascal",
        "Dorothy Hodgkin",
        "Max Planck",
        "Sophie Germain",
        "Galileo Galilei",
        "Mary Somerville",
        "Johannes Kepler",
        "Chien-Shiung Wu",
        "Michael Faraday",
        "Caroline Herschel",
        "Enrico Fermi",
        "Ida Noddack",
        "James Maxwell",
        "Maria Agnesi",
        "Alfred Wegener",
        "Edith Clarke",
    ),
}


def constrained_request(name: str, round_: int = 0) -> tuple[str, dict[str, Any]]:
    """The prompt (its ``round_``-th subject, cycling) and the constraining body fields."""
    template, fields = CONSTRAINED[name]
    subjects = SUBJECTS[name]
    return template.format(subject=subjects[round_ % len(subjects)]), fields


def function_60() -> str:
    """A plausible 60-line Python function (the same text every run)."""
    head = [
        'def summarize_orders(orders, currency="EUR", limit=10):',
        '    """Summarize a list of orders: totals per customer and the largest orders."""',
        "    totals = {}",
        "    counts = {}",
        "    largest = []",
        "    skipped = 0",
        "    for order in orders:",
        '        if order.get("currency") != currency:',
        "            skipped += 1",
        "            continue",
        '        customer = order["customer"]',
        '        amount = float(order["amount"])',
        "        totals[customer] = totals.get(customer, 0.0) + amount",
        "        counts[customer] = counts.get(customer, 0) + 1",
        '        largest.append((amount, order["id"]))',
    ]
    body = []
    for i, name in enumerate(
        ("north", "south", "east", "west", "online", "retail", "export", "partner")
    ):
        body += [
            f'    {name}_orders = [o for o in orders if o.get("region") == "{name}"]',
            f'    {name}_total = sum(float(o["amount"]) for o in {name}_orders)',
            f'    report_region("{name}", len({name}_orders), {name}_total, rank={i + 1})',
            f'    log.debug("region %s: %d orders, %.2f", "{name}", len({name}_orders),'
            f" {name}_total)",
        ]
    tail = [
        "    largest.sort(reverse=True)",
        "    top = [order_id for _, order_id in largest[:limit]]",
        "    average = sum(totals.values()) / max(len(totals), 1)",
        "    return {",
        '        "currency": currency,',
        '        "totals": totals,',
        '        "counts": counts,',
        '        "top": top,',
        '        "average": average,',
        "    }",
    ]
    lines = head + body + tail
    while len(lines) < 60:
        lines.insert(len(head), "    # keep the running totals in the order currency")
    return "\n".join(lines[:60]) + "\n"


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
    """The completions body fields of one request of an edit family (prompt, maybe
    prediction: the original function, whose first line the answer changes)."""
    code = function_60()
    prompt = CHATML.format(user=INSTRUCTION.format(code=code), start=ANSWER_START)
    body: dict[str, Any] = {"prompt": prompt}
    if family == PREDICTION_FAMILY:
        body["prediction"] = {"type": "content", "content": code + "```"}
    return body
