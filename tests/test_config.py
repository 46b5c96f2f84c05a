"""The server config: three formats, unknown keys rejected with their location, every problem reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcpipe.config import DEFAULT_CONFIG, ConfigError, load_config, parse_config
from mcpipe.server.cli import check_config, parse_hostport

TOML = """
name = "gw"
python_tools = ["mymod:registry"]
builtins = ["echo"]

[mcpServers.github]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-github"]
env = { GITHUB_TOKEN = "${GH}" }
prefix = "gh"
exclude = ["delete_*"]

[mcpServers.search]
url = "https://search.example/mcp"
headers = { Authorization = "Bearer ${SEARCH_KEY:-none}" }
connect = "lazy"

[pipe]
max_steps = 20
timeout_ms = 30000

[[auth.tokens]]
env = "ALICE_TOKEN"
principal = "alice"
tools = ["gh.*", "search.*"]

[costs]
"search.query" = 0.5

[audit]
path = "audit/log.jsonl"

[http]
port = 9000
allowed_hosts = ["mcp.example.com"]
"""

ENV = {"GH": "ghp_x", "ALICE_TOKEN": "secret"}


def test_a_toml_config_decodes_into_every_section():
    cfg = parse_config(TOML, "toml", environ=ENV)
    gh = cfg.mcpServers["github"]
    assert gh.transport == "stdio" and gh.env == {"GITHUB_TOKEN": "ghp_x"} and gh.prefix == "gh"
    search = cfg.mcpServers["search"]
    assert search.transport == "http" and search.headers == {"Authorization": "Bearer none"}
    assert search.connect == "lazy"
    assert (cfg.pipe.max_steps, cfg.pipe.timeout_ms, cfg.pipe.max_depth) == (20, 30000, 5)
    assert cfg.auth.tokens[0].principal == "alice" and cfg.auth.tokens[0].tools == ["gh.*", "search.*"]
    assert cfg.costs == {"search.query": 0.5}
    assert cfg.http.port == 9000 and cfg.builtins == ["echo"] and cfg.name == "gw"


def test_yaml_and_json_configs_decode_the_same_way():
    doc = {"mcpServers": {"fs": {"command": "fs-server", "args": ["/tmp"]}}, "pipe": {"max_depth": 3}}
    import yaml

    from_json = parse_config(json.dumps(doc), "json")
    from_yaml = parse_config(yaml.safe_dump(doc), "yaml")
    assert from_json == from_yaml
    assert from_json.mcpServers["fs"].args == ["/tmp"] and from_json.pipe.max_depth == 3


def test_an_empty_document_is_the_default_config():
    assert parse_config("", "toml") == DEFAULT_CONFIG
    assert parse_config("{}", "json") == DEFAULT_CONFIG


@pytest.mark.parametrize(
    ("doc", "location", "words"),
    [
        ({"pipe": {"max_step": 3}}, "pipe.max_step", "unknown key `max_step` (did you mean `max_steps`?)"),
        ({"mcpServers": {"a": {"command": "x", "argz": []}}}, "mcpServers.a.argz", "(did you mean `args`?)"),
        ({"pipe": {"max_steps": "many"}}, "pipe.max_steps", "expected `int`, got `str`"),
        ({"mcpServers": {"a": {"command": "x", "args": [1]}}}, "mcpServers.a.args[0]", "expected `str`"),
        ({"mcpServers": {"a": {}}}, "mcpServers.a", "exactly one of `command`"),
        ({"mcpServers": {"a": {"command": "x", "url": "http://y"}}}, "mcpServers.a", "exactly one of"),
        ({"mcpServers": {"a": {"url": "ftp://y"}}}, "mcpServers.a.url", "http:// or https://"),
        ({"mcpServers": {"a.b": {"command": "x"}}}, "mcpServers.a.b", "server names"),
        ({"mcpServers": {"a": {"command": "x", "connect": "never"}}}, "mcpServers.a.connect", "invalid enum value"),
        ({"auth": {"tokens": [{"env": "NOPE_UNSET", "principal": "p"}]}}, "auth.tokens[0].env", "is not set"),
        ({"mcpServers": {"a": {"command": "${NOPE_UNSET}"}}}, "mcpServers.a.command", "`NOPE_UNSET` is not set"),
        ({"costs": {"x": -1}}, "costs.x", "negative"),
        ({"costs": {"mcp_pipe": 2}}, "costs.mcp_pipe", "cost 0"),
        ({"pipe": {"max_steps": 0}}, "pipe.max_steps", "positive"),
        ({"http": {"path": "mcp"}}, "http.path", "start with `/`"),
        ({"python_tools": ["nocolon"]}, "python_tools[0]", "module:registry"),
        ({"server": {}}, "server", "unknown key `server`"),
        ({"builtins": ["echo", "rm_rf"]}, "builtins[1]", "no built-in tool `rm_rf`"),
        ({"interaction": {"state_ttl_s": float("inf")}}, "interaction.state_ttl_s", "expected `float` <= 604800"),
        ({"interaction": {"state_ttl_s": 0}}, "interaction.state_ttl_s", "expected `float` > 0"),
        ({"interaction": {"sweep_interval_s": 0}}, "interaction.sweep_interval_s", "expected `float` >= 0.1"),
        ({"mcpServers": {"a": {"command": "x", "sse_poll_ms": 0}}}, "mcpServers.a.sse_poll_ms", "expected `int` >= 1"),
    ],
)
def test_a_bad_config_names_where_the_problem_is(doc, location, words):
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps(doc), "json", environ={})
    problems = info.value.problems
    assert any(p.location == location and words in p.message for p in problems), problems


def test_every_problem_is_reported_not_only_the_first():
    doc = {"pipe": {"max_steps": "x"}, "http": {"port": "y"}, "mcpServers": {"a": {}, "b": {"nope": 1}}, "zzz": 1}
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps(doc), "json")
    assert {p.location for p in info.value.problems} == {
        "pipe.max_steps",
        "http.port",
        "mcpServers.a",
        "mcpServers.b.nope",
        "zzz",
    }


def test_a_file_that_is_not_valid_toml_says_so():
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_config("[pipe\nmax_steps = 1", "toml")


def test_load_config_picks_the_format_by_suffix_and_prefixes_problems_with_the_file(tmp_path):
    good = tmp_path / "mcpipe.yaml"
    good.write_text("pipe:\n  max_steps: 7\n")
    cfg = load_config(good)
    assert cfg.pipe.max_steps == 7 and cfg.base_dir == str(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"pipe": {"oops": 1}}')
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(info.value.problems[0]) == f"{bad}:pipe.oops: unknown key `oops`"
    with pytest.raises(ConfigError, match="ends in"):
        load_config(tmp_path / "x.ini")


def test_check_config_prints_every_problem_and_exits_1(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[pipe]\nmax_steps = "x"\n[http]\nporrt = 1\n')
    assert check_config(str(bad)) == 1
    err = capsys.readouterr().err
    assert "pipe.max_steps: expected `int`" in err and "http.porrt: unknown key `porrt` (did you mean `port`?)" in err


def test_check_config_loads_python_tools_and_reports_an_import_failure(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('python_tools = ["mcpipe.tools.builtin:nothing_here", "no_such_module_x:reg"]\n')
    assert check_config(str(cfg)) == 1
    err = capsys.readouterr().err
    assert "python_tools[0]: cannot load" in err and "python_tools[1]: cannot load" in err
    ok = tmp_path / "ok.toml"
    ok.write_text("[pipe]\nmax_steps = 3\n")
    assert check_config(str(ok)) == 0
    assert "ok" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        (":9", ("127.0.0.1", 9)),
        ("80", ("127.0.0.1", 80)),
        ("[::1]:5", ("::1", 5)),
    ],
)
def test_http_addresses_parse_with_a_loopback_default_host(text, expected):
    assert parse_hostport(text) == expected


EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("name", ["mcpipe.toml", "gateway.yaml"])
def test_the_example_configs_load(name, monkeypatch):
    for var in ("GITHUB_TOKEN", "SEARCH_API_KEY", "MCPIPE_TOKEN_TEAM"):
        monkeypatch.setenv(var, "x")
    cfg = load_config(EXAMPLES / name)
    assert cfg.mcpServers


def test_the_claude_desktop_snippet_is_the_mcp_servers_format_mcpipe_reads():
    doc = json.loads((EXAMPLES / "claude_desktop_config.json").read_text())
    entry = doc["mcpServers"]["mcpipe"]
    assert entry["args"][:2] == ["serve", "--stdio"]
    parse_config(json.dumps({"mcpServers": {"mcpipe": {**entry, "command": "mcpipe"}}}), "json")


def test_declared_pipelines_are_checked_with_the_config_and_their_problems_located():
    doc = {
        "pipelines": [
            {
                "name": "greet",
                "input_schema": {"type": "object"},
                "steps": [{"kind": "tool", "id": "a", "tool": "no_such_tool", "args": {}}, {"kind": "nope", "id": "b"}],
            }
        ]
    }
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps(doc), "json")
    locations = [p.location for p in info.value.problems]
    assert locations and all(loc.startswith("pipelines") for loc in locations)
    ok = {
        "pipelines": [
            {"name": "hi", "input_schema": {"type": "object"}, "steps": [{"kind": "value", "id": "v", "value": 1}]}
        ]
    }
    assert parse_config(json.dumps(ok), "json").pipelines[0].name == "hi"


def test_the_store_url_reads_its_password_and_host_from_the_environment() -> None:
    doc = '[store]\nurl = "redis://:${REDIS_PASSWORD}@${REDIS_HOST:-redis}:6379/0"\n'
    config = parse_config(doc, environ={"REDIS_PASSWORD": "s3cret"})
    assert config.store.url == "redis://:s3cret@redis:6379/0"
    with pytest.raises(ConfigError) as caught:
        parse_config(doc, environ={})
    assert [str(p) for p in caught.value.problems] == ["store.url: environment variable `REDIS_PASSWORD` is not set"]
