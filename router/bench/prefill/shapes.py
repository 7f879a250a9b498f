"""``speclane bench prefill``: the agent programs' request bodies, trimmed to the bench's size
(pure).

Claude Code, Qwen Code and Codex: their captured bodies (``tests/fixtures/agent-prompts/``, made by
``tests/clients/capture_prompts.py``). Their prompts are 12k+ tokens, beyond the default
model's context and ~80 s of CPU prefill each, so every body goes through one ``trim`` (the
same for both targets): the system prompt's first ``SYSTEM_CHARS`` characters, every other
text its first ``TEXT_CHARS``, each cut at a line's end; every line naming the date or the
billing code kept wherever it stands (those are the lines that break prefixes); the tools
named in ``TOOLS`` only. What trim keeps of one text is a function of that text, so two
requests that shared a prefix still share it.

Derived, not captured (the capture script cannot script them yet), and built from the
captured bodies the way the programs build them:

- a compaction: Claude Code's first request with the summary as its first user message and
  another billing code (the summary changes the first message, so the code);
- a sub-agent (Claude Code's Agent/Task tool): the billing line (another code), the SDK
  line, a sub-agent system prompt in place of the main one, the parent's tools less
  ``Agent``, the task as the one user message;
- a later turn: a captured conversation, the scripted answer, one more question.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "agent-prompts"
SYSTEM_CHARS = 2400
TEXT_CHARS = 800
TOOLS = frozenset({"Read", "Edit", "Write", "read_file", "glob", "exec_command"})
SYSTEM_ROLES = ("system", "developer")
# Lines that differ between conversations or days: never trimmed away.
VOLATILE = re.compile(r"x-anthropic-billing-header|date is|current date", re.IGNORECASE)
BILLING_CODE = re.compile(r"(cc_version=[0-9.]+\.)([0-9a-f]{3})")


def load(name: str, fixtures: Path = FIXTURES) -> list[dict[str, Any]]:
    bodies = json.loads((fixtures / f"{name}.json").read_text(encoding="utf-8"))
    assert isinstance(bodies, list)
    return bodies


def head(text: str, chars: int) -> str:
    """``text``'s lines up to ``chars`` characters, and every volatile line after them."""
    if len(text) <= chars:
        return text
    cut = text.rfind("\n", 0, chars) + 1 or chars
    kept = [text[:cut]]
    kept += [line + "\n" for line in text[cut:].split("\n") if VOLATILE.search(line)]
    return "".join(kept)


def _trim_content(content: Any, chars: int) -> Any:
    if isinstance(content, str):
        return head(content, chars)
    if isinstance(content, list):
        return [_trim_part(p, chars) for p in content]
    return content


def _trim_part(part: Any, chars: int) -> Any:
    if not isinstance(part, dict):
        return part
    out = dict(part)
    for key in ("text", "content", "output"):
        if isinstance(out.get(key), str):
            out[key] = head(out[key], chars)
        elif isinstance(out.get(key), list):
            out[key] = [_trim_part(p, chars) for p in out[key]]
    return out


def _tool_name(tool: dict[str, Any]) -> str:
    function = tool.get("function")
    return str(function.get("name") if isinstance(function, dict) else tool.get("name"))


def trim(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic, chat or Responses body at the bench's size (module docstring)."""
    out = copy.deepcopy(body)
    # the programs' session ids (Claude Code's user field, Codex's client metadata)
    out.pop("metadata", None)
    out.pop("client_metadata", None)
    if isinstance(out.get("system"), list):  # Anthropic: text blocks, the long one last
        out["system"] = [_trim_part(b, SYSTEM_CHARS) for b in out["system"]]
    if isinstance(out.get("instructions"), str):
        out["instructions"] = head(out["instructions"], SYSTEM_CHARS)
    messages = out.get("messages") or out.get("input") or []
    for i, message in enumerate(messages):
        first_system = i == 0 and message.get("role") in SYSTEM_ROLES
        chars = SYSTEM_CHARS if first_system else TEXT_CHARS
        if "content" in message:
            message["content"] = _trim_content(message["content"], chars)
        if "output" in message:
            message.update(_trim_part({"output": message["output"]}, chars))
    if "tools" in out:
        out["tools"] = [t for t in out["tools"] if _tool_name(t) in TOOLS]
    return out


def with_max_tokens(body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The body asking for ``max_tokens`` at temperature 0, streamed; the programs' own
    output settings (32k tokens, adaptive thinking) dropped."""
    out = {k: v for k, v in body.items() if k not in ("thinking", "output_config", "max_tokens")}
    key = "max_output_tokens" if "input" in body else "max_tokens"
    return {**out, key: max_tokens, "temperature": 0, "stream": True}


# --- derived shapes -----------------------------------------------------------------------------


def rebill(body: dict[str, Any], code: str) -> dict[str, Any]:
    """``body`` with another billing code (Claude Code derives it from the first message)."""
    text = BILLING_CODE.sub(lambda m: m.group(1) + code, json.dumps(body, ensure_ascii=False))
    out = json.loads(text)
    assert isinstance(out, dict)
    return out


def _replace_user_text(message: dict[str, Any], text: str) -> dict[str, Any]:
    """A user message with its last text part (the user's own words) replaced."""
    parts = list(message["content"])
    last = max(i for i, p in enumerate(parts) if p.get("type") == "text")
    parts[last] = {"type": "text", "text": text}
    return {**message, "content": parts}


SUMMARY = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The summary below covers the earlier portion of the conversation.\n\nSummary:\n"
    "1. Primary Request and Intent: the user asked what notes.txt says.\n"
    "2. Files: notes.txt (two lines; the second is a SECRET-LINE with the answer).\n"
    "3. Pending Tasks: none.\n"
    "Please continue the conversation from where we left it off without asking the user any "
    "further questions. Continue with the last task that you were asked to work on."
)


def compaction(first: dict[str, Any]) -> dict[str, Any]:
    """Claude Code's request after a compaction: the same system prompt and tools, the summary
    as the first user message, another billing code."""
    out = rebill(first, "c0d")
    messages = out["messages"]
    messages[0] = _replace_user_text(messages[0], SUMMARY)
    return out


SUBAGENT_PROMPT = (
    "You are an agent for Claude Code, Anthropic's official CLI for Claude. Given the user's "
    "message, you should use the tools available to complete the task. Do what has been "
    "asked; nothing more, nothing less. When you complete the task simply respond with a "
    "detailed writeup.\n\nYour strengths:\n- Searching for code, configurations, and "
    "patterns across large codebases\n- Analyzing multiple files to understand system "
    "architecture\n- Investigating complex questions that require exploring many files\n\n"
    "Guidelines:\n- For file searches: Use Grep or Glob when you need to search broadly.\n"
    "- For analysis: Start broad and narrow down.\n- NEVER create files unless they're "
    "absolutely necessary for achieving your goal.\n- In your final response always share "
    "relevant file names and code snippets. Any file paths you return in your response MUST "
    "be absolute.\n"
)


def subagent(first: dict[str, Any], task: str, code: str) -> dict[str, Any]:
    """Claude Code's sub-agent request: its own system prompt after the billing and SDK lines,
    the parent's environment block, the parent's tools less ``Agent``, the task."""
    parent = rebill(first, code)
    billing, sdk = parent["system"][0], parent["system"][1]
    environment = next(_text(m["content"]) for m in parent["messages"] if m["role"] == "system")
    system = [billing, sdk, {"type": "text", "text": SUBAGENT_PROMPT + "\n" + environment}]
    tools = [t for t in parent["tools"] if t.get("name") != "Agent"]
    messages = [{"role": "user", "content": [{"type": "text", "text": task}]}]
    return {**parent, "system": system, "tools": tools, "messages": messages}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def next_turn_anthropic(body: dict[str, Any], answer: str, question: str) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        {"role": "user", "content": [{"type": "text", "text": question}]},
    ]
    return out


def codex_turns(fixtures: Path = FIXTURES) -> list[dict[str, Any]]:
    """Codex's three requests: the first ask, after its shell call, the next ask."""
    first = load("codex-turn-1", fixtures)
    return [*first[:2], load("codex-turn-2", fixtures)[0]]
