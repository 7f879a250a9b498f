"""One real turn of each agent program against a real model (slow: clients, realmodel).

Claude Code, Codex, Qwen Code and aider each ask one question and must finish the turn (exit
code 0, an answer printed, every request speclane served answered 200) in front of

- ``lanes``: speclane's own MLX lanes on the default model, and
- ``mlx_lm``: a real ``mlx_lm.server`` behind speclane (a backend of kind ``mlx_lm``) serving
  the default model with a Qwen-style guard prepended to its chat template, so that a system
  message after the first is refused ("System message must be at the beginning."). Claude
  Code sends one after the user's message on every turn: speclane folds it.

The programs' default first requests (9k to 24k tokens) do not fit the default model's 8,192
tokens, so each runs with the small-context set-up ``docs/clients/`` documents: a short
system prompt or instructions file and no (or few) tools. What the 135M model answers does
not matter; it must end its answer by itself, hence a question it answers in a few words
(greedy decoding: the lanes' and mlx_lm.server's default). A default policy caps answers
at ``CAP`` tokens, so that a model that loops costs seconds, not minutes.

Each backend is started once for the module (the fixture's two parameters run one after
the other); the programs run serially.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from router.lanes.blas import preload_env
from router.lanes.modelprep import DEFAULT_MODEL_NAME, ensure_default_models
from tests.clients.programs import require
from tests.clients.scripted import Ran, run_program
from tests.realmodel import Router, start_router, stop_router

pytestmark = [pytest.mark.clients, pytest.mark.realmodel, pytest.mark.timeout(600)]

QUESTION = "Is the sky blue? Answer yes or no."
# "Be brief." let the 135M model loop to the cap on about half of Claude Code's first
# requests, as the working directory's name and the date in its prompt varied (so CI failed
# where a local run passed); this pair ended in three tokens on 60 of 60 such variants.
SYSTEM = "Answer in one word."
CAP = 256  # tokens an answer may take (the default policy's [caps] max_tokens)
TURN_LIMIT = 240.0  # seconds a program may take for its one turn
START_TIMEOUT = 180.0  # mlx_lm.server loading on 2 busy shared cores
GUARD = (
    "{%- for m in messages %}{%- if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}"
    "{%- endif %}{%- endfor %}"
)
REFUSAL = "System message must be at the beginning."
MLX_MODEL = "default_model"  # mlx_lm.server's name for the model on its command line


@dataclass(frozen=True)
class Served:
    kind: str
    router: Router
    model: str

    @property
    def root(self) -> str:
        return self.router.base_url.removesuffix("/v1")

    def access_since(self, start: int) -> list[str]:
        return [line for line in self.router.output[start:] if "speclane.access:" in line]


def guarded_copy(model: Path, into: Path) -> Path:
    """A copy of a prepared model folder (the weights linked, not copied) whose chat template
    refuses a system message after the first, as the official Qwen templates do."""
    into.mkdir()
    for item in model.iterdir():
        if item.suffix == ".safetensors":
            (into / item.name).symlink_to(item)
        else:
            shutil.copy2(item, into / item.name)
    template = into / "chat_template.jinja"
    if template.exists():
        template.write_text(GUARD + template.read_text())
    else:
        config_path = into / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = GUARD + config["chat_template"]
        config_path.write_text(json.dumps(config))
    return into


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post_json(url: str, body: dict[str, object]) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=START_TIMEOUT) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@dataclass
class MlxServer:
    proc: subprocess.Popen[str]
    url: str
    output: list[str]


def start_mlx_lm_server(model: Path, hf_home: Path) -> MlxServer:
    port = free_port()
    env = preload_env()
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(model)]
    proc = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    output: list[str] = []
    started = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if "Starting httpd" in line:  # logged once its socket is bound
                started.set()
        started.set()

    threading.Thread(target=pump, daemon=True).start()
    started.wait(START_TIMEOUT)
    if proc.poll() is not None or not any("Starting httpd" in line for line in output):
        proc.kill()
        raise AssertionError("mlx_lm.server did not start:\n" + "".join(output[-20:]))
    return MlxServer(proc, f"http://127.0.0.1:{port}", output)


def stop_process(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cap_answers(tmp: Path) -> None:
    (tmp / "policies").mkdir()
    (tmp / "policies" / "default.toml").write_text(f"[caps]\nmax_tokens = {CAP}\n")


@pytest.fixture(scope="module", params=["lanes", "mlx_lm"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp(f"turns-{request.param}")
    cap_answers(tmp)
    if request.param == "lanes":
        router = start_router(tmp)
        yield Served("lanes", router, DEFAULT_MODEL_NAME)
        stop_router(router)
        return
    target, _ = ensure_default_models(quiet=True)
    server = start_mlx_lm_server(guarded_copy(target, tmp / "guarded-model"), tmp / "hf")
    try:
        # The guard is in force (and the model loaded): a late system message is refused.
        late = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": "Late."},
        ]
        status, body = post_json(
            f"{server.url}/v1/chat/completions",
            {"model": MLX_MODEL, "max_tokens": 1, "messages": late},
        )
        assert status != 200 and REFUSAL in body, (status, body)
        backend = (
            '[[backends]]\nname = "mlx"\nkind = "mlx_lm"\n'
            f'base_url = "{server.url}/v1"\nmodels = ["{MLX_MODEL}"]\nread_timeout = 300\n'
        )
        router = start_router(tmp, backend, flags=("--no-lanes",))
        try:
            yield Served("mlx_lm", router, MLX_MODEL)
        finally:
            stop_router(router)
    finally:
        stop_process(server.proc)


def check_turn(served: Served, start: int, ran: Ran) -> None:
    """Exit 0, an answer printed, and every request speclane saw served with a 200."""
    seen = "--- speclane\n" + "".join(served.router.output[start:][-30:])
    assert ran.code == 0, f"{ran}\n{seen}"
    assert ran.out.strip(), f"{ran}\n{seen}"
    logged = served.router.wait_for_line(
        lambda output: any(f"model={served.model}" in line for line in served.access_since(start)),
        timeout=30,
    )
    access = served.access_since(start)
    assert logged, f"no request reached speclane:\n{''.join(access)}\n{ran}"
    refused = [line for line in access if "status=200" not in line]
    assert not refused, "".join(refused) + str(ran)
    assert REFUSAL not in ran.out + ran.err


async def test_claude_code_turn(served: Served, tmp_path: Path) -> None:
    claude = require("claude")
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": served.root,
        "ANTHROPIC_API_KEY": "local",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": served.model,
        "ANTHROPIC_SMALL_FAST_MODEL": served.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "8192",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(CAP),
        "CLAUDE_CODE_TMPDIR": str(tmp_path),  # not the /tmp/claude-<uid> other runs share
    }
    argv = [str(claude), "-p", QUESTION, "--model", served.model]
    argv += ["--system-prompt", SYSTEM, "--tools", "", "--strict-mcp-config"]
    start = len(served.router.output)
    ran = await run_program(argv, cwd=tmp_path, env=env, limit=TURN_LIMIT)
    check_turn(served, start, ran)


async def test_codex_turn(served: Served, tmp_path: Path) -> None:
    codex = require("codex")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "instructions.md").write_text(SYSTEM + "\n")
    (home / "config.toml").write_text(codex_config(served, home / "instructions.md"))
    argv = [str(codex), "exec", "--skip-git-repo-check", QUESTION]
    start = len(served.router.output)
    env = {"HOME": str(tmp_path), "CODEX_HOME": str(home), "NO_COLOR": "1"}
    ran = await run_program(argv, cwd=work, env=env, limit=TURN_LIMIT)
    check_turn(served, start, ran)


def codex_config(served: Served, instructions: Path) -> str:
    """docs/clients/codex.md's small-context configuration."""
    return f"""\
model = "{served.model}"
model_provider = "speclane"
model_context_window = 8192
model_instructions_file = "{instructions}"
web_search = "disabled"
include_permissions_instructions = false
include_apps_instructions = false
include_environment_context = false

[features]
multi_agent = false
goals = false
image_generation = false
skill_search = false
apps = false
plugins = false

[model_providers.speclane]
name = "speclane"
base_url = "{served.router.base_url}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""


async def test_qwen_code_turn(served: Served, tmp_path: Path) -> None:
    qwen = require("qwen")
    home = tmp_path / "home"
    home.mkdir()
    argv = [str(qwen), QUESTION, "--auth-type", "openai"]
    argv += ["--openai-base-url", served.router.base_url, "--openai-api-key", "local"]
    argv += ["--model", served.model, "--bare", "--system-prompt", SYSTEM]
    argv += ["--exclude-tools", *QWEN_TOOLS]
    env = {
        "HOME": str(home),
        "NO_COLOR": "1",
        "QWEN_CODE_DISABLE_TELEMETRY": "1",
        "QWEN_CODE_MAX_OUTPUT_TOKENS": str(CAP),
    }
    start = len(served.router.output)
    ran = await run_program(argv, cwd=tmp_path, env=env, limit=TURN_LIMIT)
    check_turn(served, start, ran)


# Qwen Code 0.24.4's tools under --bare (about 4k tokens of schemas).
QWEN_TOOLS = ("edit", "notebook_edit", "read_file", "run_shell_command", "get_goal", "update_goal")


async def test_aider_turn(served: Served, tmp_path: Path) -> None:
    aider = require("aider")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    name = f"openai/{served.model}"
    settings = home / "model-settings.yml"
    settings.write_text(f"- name: {name}\n  extra_params:\n    max_tokens: {CAP}\n")
    metadata = home / "model-metadata.json"
    metadata.write_text(
        json.dumps({name: {"max_input_tokens": 8192, "max_output_tokens": CAP, "mode": "chat"}})
    )
    argv = [str(aider), "--model", name, "--openai-api-base", served.router.base_url]
    argv += ["--openai-api-key", "local", "--model-settings-file", str(settings)]
    argv += ["--model-metadata-file", str(metadata), "--edit-format", "whole", "--no-git"]
    argv += ["--yes-always", "--no-check-update", "--analytics-disable", "--no-show-release-notes"]
    argv += ["--no-pretty", "--no-fancy-input", "--map-tokens", "0", "--message", QUESTION]
    env = {"HOME": str(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TERM": "dumb"}
    start = len(served.router.output)
    ran = await run_program(argv, cwd=work, env=env, limit=TURN_LIMIT)
    check_turn(served, start, ran)
    assert "Tokens:" in ran.out, str(ran)  # aider's line after a completed answer
