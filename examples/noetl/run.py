"""The example's one command, offline: a stand-in model (examples/standins.py) answers the turn, then
``mcpipe playbook run`` runs the playbook against it and prints its answer.

    python examples/noetl/run.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from standins import model, run_and_print

HERE = Path(__file__).parent


def review(request: dict) -> str:
    """What the stand-in model answers: what it was asked shows in it (the prompt and the resource)."""
    asked = "\n".join(m["content"] for m in request["messages"] if m["role"] == "user")
    environment = "production" if "The production environment was set up" in asked else "unknown"
    checks = sum(item in asked for item in ("replicas set for the environment", "high availability on"))
    return f"GO: {checks} of 2 checks pass for the {environment} environment."


with model(review) as base_url:
    env = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "stand-in"}
    args = ["playbook", "run", str(HERE / "deploy_review.yaml"), "--config", str(HERE / "mcpipe.toml")]
    sys.exit(run_and_print(args, env))
