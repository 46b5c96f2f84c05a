"""Pass on the lines of stdin that match a pattern, each prefixed, as they come (``make serve``'s progress).

Usage: ``COMMAND 2>&1 | python scripts/progress_lines.py PREFIX REGEX``. Always exits 0, so that with
``set -o pipefail`` the pipeline's status is the command's.
"""

from __future__ import annotations

import re
import sys


def main(prefix: str, pattern: str) -> int:
    wanted = re.compile(pattern)
    for line in iter(sys.stdin.readline, ""):
        text = line.strip()
        if text and wanted.search(text):
            print(f"{prefix} {text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
