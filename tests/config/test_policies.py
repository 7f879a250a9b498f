"""Policy files: loading, the errors they name, and who a request is."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.config.policies import (
    DEFAULT_CLIENT,
    Policy,
    PolicyError,
    PolicySet,
    Unauthorized,
    bearer_token,
    load_policies,
    mask_key,
)
from router.config.presets import DEFAULT_PRESETS

REPO_POLICIES = Path(__file__).resolve().parents[2] / "policies"
SECRET = "sk-test-0123456789abcdef"


def write(directory: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def problems(directory: Path, **kw: object) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policies(directory, **kw)  # type: ignore[arg-type]
    assert str(info.value) == "\n".join(info.value.problems)
    return list(info.value.problems)


@pytest.fixture
def policies(tmp_path: Path) -> PolicySet:
    write(
        tmp_path,
        {
            "default.toml": 'client = "default"\n',
            "agent.toml": f"""
            priority = 10
            [match]
            client_header = ["Agent"]
            user_agent = ["^agent/\\\\d"]
            api_keys = ["{SECRET}"]
        """,
            "locked.toml": """
            require_api_key = true
            [match]
            client_header = ["locked"]
            user_agent = ["locked"]
            api_key_env = "LOCKED_KEY"
        """,
            "zz-wide.toml": '[match]\nuser_agent = ["agent"]\n',
        },
    )
    return load_policies(tmp_path, environ={"LOCKED_KEY": "locked-secret"})


def test_shipped_policies_are_valid() -> None:
    env = {"SPECLANE_BATCH_API_KEY": "batch-key"}
    loaded = load_policies(REPO_POLICIES, presets=DEFAULT_PRESETS.keys(), environ=env)
    assert {p.client for p in loaded} == {"default", "openclaw", "opta-cli", "batch", "claude-code"}
    assert loaded.warnings == ()
    agent = loaded.identify(None, None, "OpenClaw/1.4 (darwin)")
    assert (agent.client, agent.default_preset, agent.lane_for("interactive", DEFAULT_PRESETS)) == (
        "openclaw",
        "interactive",
        "speculative",
    )
    batch = loaded.identify("batch-key", None, None)
    assert batch.priority < 0 < agent.priority
    assert batch.lane_for("throughput", DEFAULT_PRESETS) == "batching"
    assert (batch.max_concurrency or 0) > (agent.max_concurrency or 0)
    assert loaded.identify(None, "opta-cli", None).client == "opta-cli"
    claude = loaded.identify(None, None, "claude-cli/2.1.332 (external, sdk-cli)")
    assert (claude.client, claude.caps.max_tokens) == ("claude-code", 8192)
    # The header alone does not open a keyed client: it is answered like an unknown name.
    assert loaded.identify(None, "batch", None).client == DEFAULT_CLIENT


def test_shipped_batch_policy_is_inactive_without_its_key_and_says_so_once() -> None:
    """A note, not a warning: a newcomer did not cause it (the first screen stays clean)."""
    loaded = load_policies(REPO_POLICIES, environ={})
    assert loaded.warnings == ()
    (note,) = loaded.notes
    assert "batch.toml: inactive until $SPECLANE_BATCH_API_KEY is set" in note


def test_precedence_key_then_header_then_user_agent_then_default(policies: PolicySet) -> None:
    assert policies.match(SECRET, "locked", "locked").via == "api_key"
    assert policies.match(SECRET, "locked", "locked").policy.client == "agent"
    assert policies.match(None, "agent", "locked-ua").policy.client == "agent"
    assert policies.match(None, "agent", None).via == "client_header"
    assert policies.match(None, None, "agent/2 linux").via == "user_agent"
    assert policies.match(None, "stranger", "curl/8").policy.client == DEFAULT_CLIENT
    assert policies.match(None, None, None).via == "default"


def test_header_is_case_insensitive_and_user_agents_go_in_file_order(
    policies: PolicySet,
) -> None:
    assert policies.identify(None, " AGENT ", None).client == "agent"
    # "agent/2" matches both agent.toml and zz-wide.toml: the first file wins.
    assert policies.identify(None, None, "agent/2").client == "agent"
    assert policies.identify(None, None, "my agent").client == "zz-wide"


def test_an_unknown_key_falls_through_when_no_key_is_required(policies: PolicySet) -> None:
    identity = policies.match("sk-unknown", "agent", None)
    assert (identity.policy.client, identity.via, identity.key_presented) == (
        "agent",
        "client_header",
        True,
    )
    assert policies.identify("EMPTY", None, None).client == DEFAULT_CLIENT


@pytest.mark.parametrize(
    ("key", "header", "agent"),
    [
        (None, "locked", None),
        (None, None, "locked/1"),
        ("wrong", "locked", None),
        ("wrong", None, "locked/1"),
    ],
)
def test_a_keyed_client_cannot_be_impersonated_nor_probed(
    policies: PolicySet,
    key: str | None,
    header: str | None,
    agent: str | None,
) -> None:
    """A label pointing at a key-required policy without its key gets exactly what an
    unknown label gets: the default (so a probe cannot tell that the name exists)."""
    assert policies.match(key, header, agent) == policies.match(key, "no-such-client", None)
    assert policies.identify(key, header, agent).client == DEFAULT_CLIENT


def test_the_right_key_opens_a_keyed_client(policies: PolicySet) -> None:
    assert policies.identify("locked-secret", None, None).client == "locked"


def test_a_default_that_requires_keys_closes_the_router(tmp_path: Path) -> None:
    """Every request needs some valid key: no header or user agent opens a key-less policy."""
    write(
        tmp_path,
        {
            "default.toml": 'require_api_key = true\n[match]\napi_keys = ["house-key"]\n',
            "open.toml": '[match]\nclient_header = ["open"]\nuser_agent = ["^open-ua"]\n',
            "keyed.toml": 'require_api_key = true\n[match]\napi_keys = ["keyed-key"]\n'
            'client_header = ["keyed"]\n',
        },
    )
    loaded = load_policies(tmp_path)
    assert loaded.keyless() == ()
    assert loaded.identify("house-key", None, None).client == DEFAULT_CLIENT
    assert loaded.identify("keyed-key", "open", "open-ua/1").client == "keyed"
    for key, code in ((None, "missing_api_key"), ("guess", "invalid_api_key")):
        for header, agent in (
            (None, "curl/8"),
            ("open", None),
            (None, "open-ua/1"),
            ("open", "open-ua/1"),
            ("keyed", None),
            ("nobody", None),
        ):
            with pytest.raises(Unauthorized) as info:
                loaded.identify(key, header, agent)
            err = info.value
            assert err.code == code, (key, header, agent)
            # Alike for every label: nothing tells which names exist.
            assert err.client == "default"


@pytest.mark.parametrize("closed", [False, True])
def test_a_key_that_is_not_utf8_is_refused(tmp_path: Path, closed: bool) -> None:
    """aiohttp keeps undecodable header bytes as lone surrogates: that is nobody's key."""
    write(tmp_path, {"default.toml": f"require_api_key = {str(closed).lower()}\n"})
    loaded = load_policies(tmp_path)
    for token in ("\udcff\udcfe", "sk-\udc80"):
        with pytest.raises(Unauthorized) as info:
            loaded.identify(token, None, None)
        assert info.value.code == "invalid_api_key"


def test_keyless_is_the_one_rule(policies: PolicySet) -> None:
    assert {p.client for p in policies.keyless()} == {"default", "agent", "zz-wide"}
    assert all(policies.admits_without_key(p) == (p in policies.keyless()) for p in policies)


def test_missing_default_is_implied_and_permissive(tmp_path: Path) -> None:
    write(tmp_path, {"a.toml": '[match]\nclient_header = "a"\n'})
    loaded = load_policies(tmp_path)
    assert loaded.default.client == DEFAULT_CLIENT
    assert loaded.sources[DEFAULT_CLIENT] == "(implied)"
    assert loaded.identify(None, None, None) == Policy(client=DEFAULT_CLIENT)
    assert PolicySet.implied().default.allow_lane_override
    assert PolicySet.implied().default.max_concurrency is None


def test_client_defaults_to_the_file_stem(tmp_path: Path) -> None:
    write(tmp_path, {"my-tool.toml": "priority = 1\n"})
    assert load_policies(tmp_path).get("my-tool") is not None


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    write(tmp_path, {"bad.toml": "priority = \n"})
    [line] = problems(tmp_path)
    assert line.startswith(f"{tmp_path / 'bad.toml'}: invalid TOML:")


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ('priority = "high"', "priority", "valid integer"),
        ("bogus = 1", "bogus", "Extra inputs are not permitted"),
        ("max_concurrency = 0", "max_concurrency", "greater than or equal to 1"),
        ('client = "has space"', "client", "pattern"),
        (
            '[lanes]\ninteractive = "fast"',
            "lanes.interactive",
            "'speculative', 'batching' or 'auto'",
        ),
        ('[match]\nuser_agent = ["(unclosed"]', "match.user_agent", "invalid regular expression"),
        ('[match]\napi_key_env = ["1BAD"]', "match.api_key_env", "not an environment variable"),
        ('[match]\nclient_header = [" "]', "match.client_header", "empty client header"),
        ('[caps]\naction = "drop"', "caps.action", "'clamp' or 'reject'"),
        (
            'presets = ["throughput"]\ndefault_preset = "interactive"',
            "(top level)",
            "not in presets",
        ),
        ('presets = ["throughput"]\n[lanes]\ninteractive = "batching"', "(top level)", "lanes."),
    ],
)
def test_validation_errors_name_file_key_and_problem(
    tmp_path: Path,
    text: str,
    key: str,
    words: str,
) -> None:
    write(tmp_path, {"c.toml": text + "\n"})
    [line] = problems(tmp_path)
    assert line.startswith(f"{tmp_path / 'c.toml'}: {key}: ")
    assert words in line


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    write(tmp_path, {"a.toml": "priority = []\n", "b.toml": "queue_timeout = -1\n"})
    lines = problems(tmp_path)
    assert [Path(line.split(":")[0]).name for line in lines] == ["a.toml", "b.toml"]


def test_duplicate_client_names(tmp_path: Path) -> None:
    write(tmp_path, {"a.toml": 'client = "same"\n', "b.toml": 'client = "same"\n'})
    [line] = problems(tmp_path)
    assert (
        line == f"{tmp_path / 'b.toml'}: client: 'same' is already defined in {tmp_path / 'a.toml'}"
    )


def test_duplicate_header_values(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "a.toml": '[match]\nclient_header = ["x"]\n',
            "b.toml": '[match]\nclient_header = ["y", "X"]\n',
        },
    )
    [line] = problems(tmp_path)
    assert line.startswith(f"{tmp_path / 'b.toml'}: match.client_header[1]: 'X' is already used")


def test_duplicate_api_keys_across_files_without_printing_them(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "a.toml": f'[match]\napi_keys = ["{SECRET}"]\n',
            "b.toml": '[match]\napi_key_env = ["B_KEY"]\n',
        },
    )
    [line] = problems(tmp_path, environ={"B_KEY": SECRET})
    assert line.startswith(
        f"{tmp_path / 'b.toml'}: match.api_key_env[0]: this API key is already used by client 'a'"
    )
    assert SECRET not in line


def test_default_may_not_have_recognition_rules(tmp_path: Path) -> None:
    write(tmp_path, {"default.toml": '[match]\nuser_agent = ["x"]\n'})
    [line] = problems(tmp_path)
    assert line.startswith(f"{tmp_path / 'default.toml'}: match.user_agent: the default policy")


def test_unknown_presets_are_checked_against_the_configuration(tmp_path: Path) -> None:
    write(tmp_path, {"a.toml": 'default_preset = "turbo"\npresets = ["turbo", "throughput"]\n'})
    lines = problems(tmp_path, presets=["interactive", "throughput"])
    assert lines == [
        f"{tmp_path / 'a.toml'}: default_preset: unknown preset 'turbo' "
        "(configured presets: interactive, throughput)",
        f"{tmp_path / 'a.toml'}: presets[0]: unknown preset 'turbo' "
        "(configured presets: interactive, throughput)",
    ]
    assert load_policies(tmp_path).get("a") is not None  # without presets: not checked


def test_missing_directory(tmp_path: Path) -> None:
    assert problems(tmp_path / "nope") == [f"{tmp_path / 'nope'}: not a directory"]


def test_keys_are_never_shown(policies: PolicySet, tmp_path: Path) -> None:
    shown = repr(policies) + str(policies.key_labels) + repr(list(policies))
    assert SECRET not in shown and "locked-secret" not in shown
    assert policies.key_labels["agent"] == (mask_key(SECRET),)
    assert policies.key_labels["locked"] == ("$LOCKED_KEY",)
    assert mask_key(SECRET).startswith("key#") and len(mask_key(SECRET)) == 12


def test_unset_key_variables_are_notes_and_unprotected_keys_warn(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "a.toml": 'require_api_key = true\n[match]\napi_key_env = ["A_KEY"]\n',
            "b.toml": '[match]\nclient_header = ["b"]\napi_keys = ["b-key"]\n',
            "c.toml": 'require_api_key = true\n[match]\nclient_header = ["c"]\n',
            "d.toml": '[match]\napi_keys = ["d-key"]\napi_key_env = ["D_KEY", "E_KEY"]\n',
        },
    )
    loaded = load_policies(tmp_path, environ={"A_KEY": "  "})
    assert [w.split(": ")[1] for w in loaded.warnings] == ["require_api_key", "require_api_key"]
    assert "without its key" in loaded.warnings[0]  # b
    assert "c.toml" in loaded.warnings[1] and "no usable key" in loaded.warnings[1]
    assert [n.split(": ")[1] for n in loaded.notes] == [
        "inactive until $A_KEY is set (match.api_key_env)",
        "match.api_key_env",
    ]
    assert "$D_KEY, $E_KEY not set" in loaded.notes[1]


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer   abc  ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_policy_helpers() -> None:
    policy = Policy.model_validate(
        {
            "client": "p",
            "presets": ["interactive"],
            "lanes": {"interactive": "batching"},
            "models": {"allow": "qwen*", "aliases": {"fast": "qwen-0.5b"}},
        }
    )
    assert policy.name == "p"
    assert policy.allows_preset("interactive") and not policy.allows_preset("throughput")
    assert policy.allows_model("qwen-7b") and not policy.allows_model("llama")
    assert policy.lane_for("interactive", DEFAULT_PRESETS) == "batching"
    assert Policy(client="q").lane_for("throughput", DEFAULT_PRESETS) == "batching"
    assert Policy(client="q").lane_for(None, DEFAULT_PRESETS) == "auto"


def test_spec_overrides_that_break_the_configured_spec_are_refused_at_load(tmp_path: Path) -> None:
    from router.config.speculation import SpecSettings

    (tmp_path / "agent.toml").write_text('client = "agent"\n[spec]\nwindow_size = 64\n')
    load_policies(tmp_path)  # alone, the overrides are well-formed
    with pytest.raises(PolicyError) as err:
        load_policies(tmp_path, spec=SpecSettings())  # min_sample 128 > window_size 64
    assert any("agent.toml: spec: " in p and "window_size" in p for p in err.value.problems), (
        err.value.problems
    )
    load_policies(tmp_path, spec=SpecSettings(min_sample=32))  # fits a smaller sample


def test_cache_partitions_follow_keys_and_groups_never_labels(tmp_path: Path) -> None:
    loaded = load_policies(
        write(
            tmp_path,
            {
                "default.toml": 'client = "default"\n',
                "alice.toml": (
                    '[match]\napi_keys = ["sk-alice-000000"]\nclient_header = ["alice"]\n'
                ),
                "bob.toml": 'cache_group = "team"\n[match]\napi_keys = ["sk-bob-000000"]\n',
                "carol.toml": 'cache_group = "team"\n[match]\nuser_agent = ["carol"]\n',
                "team.toml": '[match]\napi_keys = ["sk-team-000000"]\n',
            },
        )
    )

    def partition(
        key: str | None = None, header: str | None = None, agent: str | None = None
    ) -> str:
        return loaded.cache_partition(loaded.match(key, header, agent))

    assert partition("sk-alice-000000") == "client:alice"
    assert partition("sk-bob-000000") == "group:team"
    # a policy named like a group is not in it: groups and clients are named apart
    assert partition("sk-team-000000") == "client:team"
    # identified by a header or user agent: the default's partition, whatever the policy
    assert partition(header="alice") == partition(agent="carol") == "client:default"
    assert partition() == partition("sk-unknown") == "client:default"


def test_a_cache_group_is_a_name(tmp_path: Path) -> None:
    found = problems(write(tmp_path, {"a.toml": 'cache_group = "no spaces"\n'}))
    assert len(found) == 1 and "cache_group" in found[0]


def test_the_shipped_default_policy_names_its_caps() -> None:
    """Issue #36 class 3: a request without max_tokens from the default policy no longer
    runs to the end of the context; class 4: keep_alive has a bound."""
    loaded = load_policies(REPO_POLICIES, environ={})
    assert loaded.default.caps.max_tokens == 4096
    assert loaded.default.models.max_keep_alive == 3600
    assert all(p.caps.max_tokens for p in loaded), [p.client for p in loaded]
