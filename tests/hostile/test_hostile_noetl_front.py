"""The NoETL front-end under a hostile caller (issue 27, items 1, 2, 3, 7, 8), each attack over HTTP against a
real ``mcpipe serve`` on 127.0.0.1 with ``/healthz`` probed while it runs: SQL injection through a DuckDB or
PostgreSQL step's templates (a real DuckDB, a real PostgreSQL), a sub-playbook ``path`` that leaves the catalog,
playbook chains that starved the scheduler, and a Python literal that froze the event loop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from kit.attack import served, write_config
from kit.realservers import postgres_server

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _text(answer: dict[str, Any]) -> str:
    return str(answer["content"][0]["text"])


# --- 1. DuckDB: quoted values bound, no external access -------------------------------------------------

DUCK_LOOKUP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: duck_lookup, path: hostile/duck_lookup}
workload: {name: alice, q: ali}
workflow:
  - step: start
    tool:
      kind: duckdb
      commands: |
        CREATE TABLE users AS SELECT * FROM (VALUES ('alice', 1), ('bob', 2), ('o''brien', 3)) v(name, id);
        SELECT name, id FROM users WHERE name = '{{ workload.name }}';
        SELECT name FROM users WHERE name LIKE '%{{ workload.q }}%' ORDER BY name
"""

DUCK_FILES = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: duck_files, path: hostile/duck_files}
workload: {}
workflow:
  - step: start
    tool:
      kind: duckdb
      commands: |
        COPY (SELECT 'written by a playbook' AS x) TO '{copied}'
  - step: read
    tool:
      kind: duckdb
      commands: SELECT content FROM read_text('/etc/passwd')
"""


def _sample(answer: dict[str, Any], n: int) -> Any:
    return answer["structuredContent"]["steps"]["start"][0].get(f"command_{n}_sample")


async def test_a_duckdb_steps_quoted_values_are_bound_and_duckdb_reaches_no_host_file(tmp_path):
    copied = tmp_path / "copied.csv"
    _write(tmp_path / "served", "duck_lookup", DUCK_LOOKUP)
    _write(tmp_path / "served", "duck_files", DUCK_FILES.replace("{copied}", str(copied)))
    config = write_config(tmp_path, "audit: {enabled: false}\nplaybooks: [served/*.yaml]\n")
    async with served(config) as server:
        # Before: the value was rendered into the SQL text, and the caller's UNION read /etc/passwd.
        attack = "' UNION SELECT content, 0 FROM read_text('/etc/passwd') --"
        answer, slowest = await server.probed(lambda: server.call("duck_lookup", {"name": attack, "q": "zz"}))
        assert answer["isError"] is False, _text(answer)
        assert "root:" not in _text(answer)
        assert _sample(answer, 2) is None  # no user has that name
        # A partial literal is bound too (LIKE '%...%'), and a quote in a value is a quote.
        answer = await server.call("duck_lookup", {"name": "o'brien", "q": "%' OR 1=1 --"})
        assert answer["isError"] is False, _text(answer)
        assert _sample(answer, 2) == [["o'brien", 3]] and _sample(answer, 3) is None
        answer = await server.call("duck_lookup", {"name": "bob", "q": "li"})
        assert _sample(answer, 2) == [["bob", 2]] and _sample(answer, 3) == [["alice"]]
        # Before: DuckDB ran with external access on: the playbook's COPY wrote a host file and read_text read
        # /etc/passwd. The operator's outbound.duckdb.external_access is off by default.
        answer = await server.call("duck_files", {})
        assert answer["isError"] is True
        assert "file system operations are disabled by configuration" in _text(answer), _text(answer)
        assert not copied.exists()
        assert slowest < server.stall_s, server.health
        assert server.alive and "Traceback" not in server.text()


# --- 2. PostgreSQL: every templated value inside a literal bound; none spliced outside ------------------

PG_SEARCH = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pg_search, path: hostile/pg_search}
workload: {q: ali, id: 1, names: [alice], table: people}
workflow:
  - step: start
    tool:
      kind: postgres
      auth: pg
      command: |
        SELECT name FROM people WHERE name LIKE '%{{ workload.q }}%' ORDER BY name
    next: {arcs: [{step: by_id}]}
  - step: by_id
    tool:
      kind: postgres
      auth: pg
      command: SELECT name FROM people WHERE id = {{ workload.id }} ORDER BY name
    next: {arcs: [{step: in_list}]}
  - step: in_list
    tool:
      kind: postgres
      auth: pg
      command: >-
        SELECT name FROM people WHERE name IN
        ({% for n in workload.names %}'{{ n }}'{% if not loop.last %}, {% endif %}{% endfor %}) ORDER BY name
    next: {arcs: [{step: from_table}]}
  - step: from_table
    tool:
      kind: postgres
      auth: pg
      command: SELECT count(*) AS n FROM public.{{ workload.table }}
"""


def _names(answer: dict[str, Any], step: str) -> list[str]:
    return [r["name"] for r in answer["structuredContent"]["steps"][step][0]["rows"]]


async def test_a_postgres_steps_templated_values_never_become_sql(tmp_path):
    import psycopg

    with postgres_server() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE people (id int, name text)")
            conn.execute("INSERT INTO people VALUES (1, 'alice'), (2, 'bob'), (3, 'o''brien')")
            conn.execute("CREATE TABLE secrets (name text)")
            conn.execute("INSERT INTO secrets VALUES ('s3cret-token')")
        _write(tmp_path / "served", "pg_search", PG_SEARCH)
        text = f"audit: {{enabled: false}}\nplaybooks: [served/*.yaml]\nsql: {{pg: {{url: '{url}'}}}}\n"
        async with served(write_config(tmp_path, text)) as server:
            answer = await server.call("pg_search", {})
            assert answer["isError"] is False, _text(answer)
            assert _names(answer, "start") == ["alice"] and _names(answer, "by_id") == ["alice"]
            assert _names(answer, "in_list") == ["alice"]
            # Before: `LIKE '%{{ q }}%'` was rendered into the text, and the UNION read another table.
            leak = "%' UNION SELECT name FROM secrets --"
            answer, slowest = await server.probed(lambda: server.call("pg_search", {"q": leak}))
            assert "s3cret-token" not in _text(answer)
            assert answer["isError"] is False, _text(answer)
            assert _names(answer, "start") == []
            answer = await server.call("pg_search", {"q": "'b"})  # a quote is a character of the value
            assert _names(answer, "start") == ["o'brien"]
            # Before: a value outside quotes was SQL (`id = 1 OR true` read every row); now it is bound, with its
            # type: text that is no integer fails the statement, located.
            answer = await server.call("pg_search", {"id": "0 OR true"})
            assert answer["isError"] is True
            assert "workflow[1]" in _text(answer) and "invalid input syntax for type integer" in _text(answer)
            assert "alice" not in _text(answer)
            answer = await server.call("pg_search", {"id": 2})
            assert _names(answer, "by_id") == ["bob"]
            # Values inside a `{% for %}` block are bound one by one.
            answer = await server.call("pg_search", {"names": ["bob", "x') UNION SELECT name FROM secrets --"]})
            assert "s3cret-token" not in _text(answer)
            assert _names(answer, "in_list") == ["bob"]
            # Where no value can stand (a table's name) a value must be a name: anything else is refused.
            answer = await server.call("pg_search", {"table": "people; DROP TABLE secrets"})
            assert answer["isError"] is True
            assert "workflow[3].tool.command" in _text(answer) and "FORBIDDEN" in _text(answer), _text(answer)
            assert slowest < server.stall_s, server.health
            assert server.alive and "Traceback" not in server.text()
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM secrets").fetchone() == (1,)


# --- 3. a sub-playbook's path stays in the catalog --------------------------------------------------------

RUNNER = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: runner, path: hostile/runner}
workload: {target: hostile/child}
workflow:
  - step: start
    tool: {kind: playbook, path: "{{ workload.target }}"}
"""

CHILD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: child, path: hostile/child}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.ran: child}
"""

EVIL = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: evil, path: elsewhere/evil}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.ran: the-unserved-playbook-ran}
"""


async def test_a_sub_playbook_path_reaches_only_the_playbooks_the_operator_serves(tmp_path):
    evil = _write(tmp_path / "elsewhere", "evil", EVIL)
    _write(tmp_path / "served", "runner", RUNNER)
    _write(tmp_path / "served" / "sub", "child", CHILD)
    (tmp_path / "served" / "sub" / "link.yaml").symlink_to(evil)
    config = write_config(tmp_path, "audit: {enabled: false}\nplaybooks: [served/*.yaml]\n")
    async with served(config) as server:
        answer = await server.call("runner", {"target": "served/sub/child"})
        assert answer["isError"] is False, _text(answer)
        assert answer["structuredContent"]["steps"]["start"][0]["status"] == "completed"

        async def refused(target: str) -> str:
            answer = await server.call("runner", {"target": target})
            assert answer["isError"] is True, (target, answer)
            assert "the-unserved-playbook-ran" not in _text(answer)
            return _text(answer).replace(target, "PATH")

        # Before: every parent directory up to / was a root: the unserved playbook elsewhere ran.
        outside = str(evil.with_suffix("")).lstrip("/")
        said, slowest = await server.probed(lambda: refused(outside))
        # ... and a symlink under the served directory to it, and a path with `..`.
        assert await refused("served/sub/link") == said
        assert await refused("sub/link") == said
        assert await refused("served/../elsewhere/evil") == said
        # Before: etc/passwd was opened and parsed ("has problems"), a missing file was "no playbook": an
        # oracle of which files exist. A refused path and a missing one answer alike.
        assert await refused("etc/passwd") == said
        assert await refused("etc/no-such-file") == said
        assert await refused("served/no-such-playbook") == said
        assert "workflow[0].tool.path: no playbook `PATH` in the catalog" in said, said
        assert slowest < server.stall_s, server.health
        assert server.alive and "Traceback" not in server.text()


# --- 7. playbook chains: no scheduler slot held across a sub-run, cycles by identity, depth bounded -------

TOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: level_a, path: hostile/level_a}
workflow:
  - step: start
    tool:
      - {name: wait, kind: tool, tool: slow, args: {seconds: 1.0}}
      - {name: sub, kind: playbook, path: hostile/level_b}
"""

MIDDLE = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: level_b, path: hostile/level_b}
workflow:
  - step: start
    tool: {kind: playbook, path: hostile/level_c}
"""

BOTTOM = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: level_c, path: hostile/level_c}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.done: true}
"""

AGAIN = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: again, path: hostile/again}
workload: {spelling: hostile/again}
workflow:
  - step: start
    tool: {kind: playbook, path: "{{ workload.spelling }}", input: {spelling: "{{ workload.spelling }}"}}
"""

HOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: hop_N, path: hostile/hop_N}
workload: {chain: []}
workflow:
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: hop, when: "{{ workload.chain | length > 0 }}"}]}
  - step: hop
    tool: {kind: playbook, path: "{{ workload.chain[0] }}", input: {chain: "{{ workload.chain[1:] }}"}}
"""

HOPS = 20


async def test_concurrent_playbook_chains_and_self_calls_never_starve_the_server(tmp_path):
    _write(tmp_path / "served", "level_a", TOP)
    _write(tmp_path / "served", "level_b", MIDDLE)
    _write(tmp_path / "served", "level_c", BOTTOM)
    _write(tmp_path / "served", "again", AGAIN)
    for i in range(HOPS):
        _write(tmp_path / "served", f"hop_{i}", HOP.replace("_N", f"_{i}"))
    text = "audit: {enabled: false}\nplaybooks: [served/*.yaml]\npipe: {timeout_ms: 20000}\n"
    text += 'python_tools: ["kit.tools:test_tools"]\n'
    async with served(write_config(tmp_path, text)) as server:
        # Before: 70 calls of a 3-level chain held the 64 process slots at their first level (a second's wait
        # for a tool, then the sub-playbook), each waiting for a slot for its second: 12 of 70 finished, the
        # others timed out (the pipeline's 20 s here, and never without a pipe.timeout_ms).
        warm = await server.call("level_a", {})  # the first call loads what the chain's steps need
        assert warm["isError"] is False, _text(warm)
        answers: list[dict[str, Any]] = []
        waited: list[float] = []

        async def chain(http: httpx2.AsyncClient) -> None:
            answers.append(await server.call("level_a", {}, http))

        async def innocent() -> None:
            await trio.sleep(0.3)
            t0 = time.perf_counter()
            echoed = await server.call("echo", {"x": 1})
            waited.append(time.perf_counter() - t0)
            assert echoed["isError"] is False

        async def attack() -> None:
            limits = httpx2.Limits(max_connections=80)
            with trio.fail_after(120):
                async with httpx2.AsyncClient(timeout=120, limits=limits) as http, trio.open_nursery() as nursery:
                    for _ in range(70):
                        nursery.start_soon(chain, http)
                    nursery.start_soon(innocent)

        _, slowest = await server.probed(attack)
        failed = [_text(a) for a in answers if a["isError"]]
        assert failed == [] and len(answers) == 70, failed[:3]
        assert all(a["structuredContent"]["status"] == "completed" for a in answers)
        # Starved, the innocent call waited for the slots past the pipeline's 20 s; served, it answers in
        # milliseconds (seconds on a loaded host): half the starved wait tells them apart.
        assert waited[0] < 10, waited
        # Before: a playbook running itself under another spelling of its path went 65 deep and hung there.
        for spelling in ("served/again", "served/again.yaml", "served//again", "hostile/again"):
            with trio.fail_after(30):
                answer = await server.call("again", {"spelling": spelling})
            assert answer["isError"] is True
            assert "runs itself again through its `playbook` tasks" in _text(answer), _text(answer)
        # A chain of distinct playbooks is bounded in depth.
        chain_of = [f"hostile/hop_{i}" for i in range(1, HOPS)]
        with trio.fail_after(60):
            answer = await server.call("hop_0", {"chain": chain_of})
        assert answer["isError"] is True
        assert "sub-playbooks nest deeper than 16" in _text(answer), _text(answer)
        with trio.fail_after(60):
            answer = await server.call("hop_0", {"chain": chain_of[:5]})
        assert answer["isError"] is False, _text(answer)
        assert slowest < server.stall_s, server.health
        assert server.alive and "Traceback" not in server.text()


# --- 8. a Python literal in a tool's field: bounded, off the event loop -----------------------------------

LITERAL = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: literal, path: hostile/literal}
workload: {v: "1"}
workflow:
  - step: start
    tool:
      kind: python
      input: {x: "[{{ workload.v }},]"}
      code: |
        result = {"n": len(x) if isinstance(x, list) else -1, "kind": type(x).__name__}
"""


async def test_a_huge_python_literal_in_a_tool_field_neither_freezes_nor_bloats_the_server(tmp_path):
    _write(tmp_path / "served", "literal", LITERAL)
    config = write_config(tmp_path, "audit: {enabled: false}\nplaybooks: [served/*.yaml]\n")
    async with served(config) as server:
        answer = await server.call("literal", {"v": "1, 'two', (3, 4), {'k': None}"})
        assert answer["isError"] is False, _text(answer)
        assert answer["structuredContent"]["steps"]["start"][0] == {"n": 4, "kind": "list"}
        await server.healthz()
        before = server.rss_mb()
        # Before: ast.literal_eval of 960 KB (not JSON: a trailing comma) held the GIL for ~2 s, /healthz with
        # it, and built ~400 MB of syntax tree.
        bomb = ",".join(["1"] * 480_000)
        peak = 0.0

        async def attack() -> Any:
            nonlocal peak
            async with trio.open_nursery() as nursery:
                got: list[Any] = []

                async def one() -> None:
                    got.append(await server.call("literal", {"v": bomb}))

                for _ in range(3):
                    nursery.start_soon(one)
                while len(got) < 3:
                    peak = max(peak, server.rss_mb())
                    with trio.move_on_after(0.05):
                        await trio.sleep_forever()
            return got

        got, slowest = await server.probed(attack)
        for answer in got:  # parsed within the budget, or refused by it: never past it
            text = _text(answer)
            assert not answer["isError"] or "took longer than" in text or "LIMIT" in text, text[:300]
        assert slowest < server.stall_s, server.health
        assert peak - before < 250, (before, peak)
        assert server.alive and "Traceback" not in server.text()
