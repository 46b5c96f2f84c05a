"""The sandbox's fallbacks: where a kernel (or the operator's policy) gives a python step no PID namespace, or
no uid of its own, what it detaches is still killed when it ends (the fork server is a child subreaper, and
a worker with a uid of its own kills every process of that uid)."""

from __future__ import annotations

import os

import pytest
import trio

from kit.declared import compiled, env
from kit.processes import detaching, gone
from mcpipe._sandbox import isolation
from mcpipe.declared import StepPolicy
from mcpipe.kinds import PythonPolicy
from mcpipe.tools._base import ToolContext

DETACH = detaching('[os.getuid(), os.readlink("/proc/self/ns/pid")]')


@pytest.mark.parametrize(
    ("separate_uid", "namespaces", "tag"),
    [(True, False, "600.5151"), (False, False, "600.5252"), (False, True, "600.5353"), (True, True, "600.5454")],
    ids=["own-uid-no-pidns", "server-uid-no-pidns", "server-uid-pidns", "own-uid-pidns"],
)
async def test_what_a_step_detaches_is_killed_when_it_ends_whatever_the_isolation(separate_uid, namespaces, tag):
    iso = await isolation()
    policy = StepPolicy(python=PythonPolicy(separate_uid=separate_uid, namespaces=namespaces, timeout_ms=20_000))
    step = compiled({"kind": "python", "code": DETACH, "input": {"tag": tag}}, policy)
    with trio.fail_after(30):
        out = await step.execute(env(), ToolContext())
    assert out.ok, out.error
    uid, namespace = out.output
    assert (uid != os.getuid()) == (separate_uid and iso.uid)
    assert (namespace != os.readlink("/proc/self/ns/pid")) == (namespaces and iso.pidns)
    with trio.fail_after(10):
        await gone(b"sleep\0" + tag.encode() + b"\0")


async def test_the_probe_says_what_this_machine_gives_a_worker():
    iso = await isolation()
    assert iso.dumpable and iso.subreaper
    if os.geteuid() == 0:  # this machine and CI: root, a kernel with PID namespaces
        assert (iso.uid, iso.pidns, iso.proc) == (True, True, True), iso.reasons


@pytest.mark.parametrize(
    ("separate_uid", "namespaces"),
    [(True, False), (False, False), (False, True), (True, True)],
    ids=["own-uid-no-pidns", "server-uid-no-pidns", "server-uid-pidns", "own-uid-pidns"],
)
async def test_a_step_imports_a_standard_module_the_fork_server_has_not_whatever_the_isolation(
    separate_uid, namespaces
):
    # A uid of its own cannot read Python's files under a /root of mode 0700 (this machine's pyenv): they
    # are revealed to it in a mount namespace of its own, with or without a PID namespace.
    policy = StepPolicy(python=PythonPolicy(separate_uid=separate_uid, namespaces=namespaces, timeout_ms=20_000))
    code = "import sys\nfresh = 'csv' not in sys.modules\nimport csv\nresult = [fresh, csv.QUOTE_ALL]"
    step = compiled({"kind": "python", "code": code}, policy)
    with trio.fail_after(30):
        out = await step.execute(env(), ToolContext())
    assert out.ok, out.error
    assert out.output == [True, 1]
