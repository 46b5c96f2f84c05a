"""The example's one command, offline: stand-ins of the rate API and of the model (examples/standins.py), the
export copied with its tool pointed at the API's stand-in, then ``mcpipe call rate_explained`` on it.

    python examples/piraeus/run.py
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from standins import json_api, model, run_and_print

HERE = Path(__file__).parent
EUR_USD = {"amount": 1.0, "base": "EUR", "date": "2026-11-30", "rates": {"USD": 1.0512}}
# Frankfurter's answer, for the query piraeus's mapping makes of the arguments
RATES = {"/latest": lambda query: EUR_USD if query == {"amount": "1", "from": "EUR", "to": "USD"} else None}


def explain(request: dict) -> str:
    """The stand-in model's answer, made of what the prompt step sent it."""
    asked = request["messages"][-1]["content"]
    rate = "1.0512 US dollars" if '"USD":1.0512' in asked.replace(" ", "") else "an unknown amount"
    return f"On 2026-11-30 one euro buys {rate}." if "on 2026-11-30" in asked else "I was not told the day."


with json_api(RATES) as api, model(explain) as base_url, tempfile.TemporaryDirectory() as tmp:
    shutil.copytree(HERE, tmp, dirs_exist_ok=True)
    tool = Path(tmp) / "exports/tools/get_exchange_rate.json"
    config = json.loads(tool.read_text())
    config["api"]["base_url"] = f"{api}/latest"
    tool.write_text(json.dumps(config))
    env = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "stand-in"}
    args = ["call", "rate_explained", '{"base": "EUR", "target": "USD"}', "--config", f"{tmp}/mcpipe.toml"]
    sys.exit(run_and_print(args, env))
