"""A model's first tool call checked against its schema does not import ``jsonschema`` on the event loop.

Importing it takes seconds on a loaded host (its format checkers build grammars): on the event loop that
stalls every task, the keepers renewing queued runs' leases among them, so a run's lease lapsed and it was
leased again mid-turn. Run in a fresh interpreter, where nothing imported ``jsonschema`` yet.
"""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys, threading, trio
from mcpipe.models import schema_errors_async

assert "jsonschema.validators" not in sys.modules
importer = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "jsonschema.validators":
            importer.append(threading.current_thread() is threading.main_thread())
        return None

sys.meta_path.insert(0, Watch())

async def main():
    schema = {"type": "object", "properties": {"said": {"type": "string"}}, "required": ["said"]}
    print(await schema_errors_async({"said": 1}, schema))
    print(await schema_errors_async({"said": "x"}, schema))

trio.run(main)
print("imported on the event loop's thread:", importer)
"""


def test_the_first_schema_check_of_a_tool_call_imports_jsonschema_off_the_event_loop() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "said: 1 is not of type 'string'"
    assert lines[1] == "None"
    assert lines[2] == "imported on the event loop's thread: [False]"
