"""The step kinds' registry is a table of names and modules, each module imported when its kind is first used.

The table (``mcpipe/kinds/__init__.py``) cannot go stale: every entry's module defines the kind it is listed
as, and every kind module of the packages the table points into is in the table. Listing the kinds (a
``check`` error naming them all) imports none of them, and asking for one imports its module only.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

from mcpipe.kinds import KINDS, Kind, Registry


def test_each_entry_of_the_table_names_the_module_that_defines_that_kind():
    for name in KINDS:
        module = KINDS.module_of(name)
        if module is None:  # registered at run time (a config format's own kinds, `mcpg.http`)
            continue
        kind = importlib.import_module(module).KIND
        assert isinstance(kind, Kind) and kind.name == name, module
        assert KINDS[name] is kind


def test_every_kind_module_of_the_packages_in_the_table_is_in_the_table():
    listed = {KINDS.module_of(name): name for name in KINDS}
    packages = {"mcpipe.kinds"} | {m.rpartition(".")[0] for m in listed if m is not None}
    for package in sorted(packages):
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__, f"{package}."):
            if info.name.rpartition(".")[2].startswith("_"):
                continue
            kind = getattr(importlib.import_module(info.name), "KIND", None)
            if isinstance(kind, Kind):
                assert listed.get(info.name) == kind.name, f"{info.name} defines kind {kind.name!r}, not in KINDS"


def _fresh(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_listing_the_kinds_imports_none_of_their_modules_and_asking_for_one_imports_only_it():
    out = _fresh(
        "import sys\n"
        "from mcpipe.kinds import KINDS\n"
        "names = list(KINDS)\n"
        "assert 'python' in KINDS and len(KINDS) == len(names)\n"
        "modules = [KINDS.module_of(n) for n in names]\n"
        "print(sorted(m for m in modules if m in sys.modules), KINDS.loaded())\n"
        "KINDS['value']\n"
        "print(sorted(m for m in modules if m in sys.modules), KINDS.loaded())\n"
    )
    assert out.splitlines() == ["[] []", "['mcpipe.kinds.value'] ['value']"]


def test_an_unknown_kind_is_reported_with_every_kind_listed_without_importing_any():
    out = _fresh(
        "import sys\n"
        "from mcpipe.declared import KINDS, validate_declared\n"
        "steps = [{'kind': 'transfrom', 'expression': '1'}]\n"
        "[p] = validate_declared([{'name': 'p', 'steps': steps}])\n"
        "print(p.location, p.message)\n"
        "print(KINDS.loaded())\n"
    )
    problem, loaded = out.splitlines()
    assert problem == (
        'pipelines.p.steps[0].kind unknown kind "transfrom" (did you mean `transform`?) (kinds: tool, http, '
        "graphql, command, mock, value, store_content, transform, cel_gate, plugin_transform, log, progress, "
        "elicitation, sampling, roots_list, gather, sql, sql_tx, sql_await, nats, grpc, kafka, python, duckdb, "
        "postgres, shell, twilio, parallel, pipe)"
    )
    assert loaded == "[]"


def test_a_table_entry_whose_module_defines_another_kind_fails_when_first_used():
    registry = Registry.of_modules({"valve": "mcpipe.kinds.value"})
    assert list(registry) == ["valve"]
    with pytest.raises(TypeError, match="defines kind 'value', but the registry lists it as 'valve'"):
        registry["valve"]


def test_a_kind_registered_at_run_time_cannot_take_a_name_of_the_table():
    with pytest.raises(ValueError, match="already exists"):
        KINDS.register(KINDS["value"])
    with pytest.raises(ValueError, match="already exists"):
        Registry.of_modules({"pipe": "mcpipe.kinds.value"})
