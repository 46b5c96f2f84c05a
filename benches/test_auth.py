"""The cost of a caller's JWT on the hot path: a JWT-authenticated tools/call against an unauthenticated one,
side by side, the server's CPU per call (goal: at most 1.1x once the issuer's keys and the token's verdict
are cached, ``docs/performance.md``).

    pytest benches/test_auth.py --benchmark-enable --benchmark-only -s    # for real, with the table

Under the default ``--benchmark-disable`` each test runs once, on a few hundred calls, as a smoke test.
"""

from __future__ import annotations

import json
import time

import jwt
import trio
from cryptography.hazmat.primitives.asymmetric import rsa

from server_load import Load, request_bytes, run_load, server_process, tools_call

TRIVIAL = tools_call("ping", {"text": "hi"})


def _issuer() -> tuple[str, str]:
    """An inline JWK Set and a token of its key (an hour long)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]})
    now = int(time.time())
    claims = {"iss": "https://idp.example.com", "sub": "alice", "aud": "bench", "iat": now, "exp": now + 3600}
    return jwks, jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})


async def _side_by_side(calls: int, token: str) -> dict[str, Load]:
    """Both servers up at once, the calls sent in alternating batches (so a machine busy with something else
    weighs on both alike); each server's CPU summed over its batches."""
    totals = {"open": Load(0, 0.0, 0.0), "jwt": Load(0, 0.0, 0.0)}
    async with (
        server_process("mcpipe", "/dev/null") as (open_url, open_pid),
        server_process("mcpipe", "/dev/null", "jwt") as (jwt_url, jwt_pid),
    ):
        servers = {"open": (open_url, open_pid, None), "jwt": (jwt_url, jwt_pid, token)}
        batch = max(50, calls // 10)
        for _ in range(max(1, calls // batch)):
            for variant, (url, pid, bearer) in servers.items():
                hostport, _, path = url.removeprefix("http://").partition("/")
                host, _, port = hostport.rpartition(":")
                request = request_bytes(host, int(port), "/" + path, TRIVIAL, bearer)
                load = await run_load(url, pid, TRIVIAL, clients=1, calls=batch, check=b'"hi"', request=request)
                t = totals[variant]
                totals[variant] = Load(t.calls + load.calls, t.seconds + load.seconds, t.cpu_seconds + load.cpu_seconds)
    return totals


def test_a_jwt_authenticated_call_costs_about_what_an_unauthenticated_one_does(benchmark, monkeypatch):
    calls = 300 if getattr(benchmark, "disabled", True) else 4000
    jwks, token = _issuer()
    monkeypatch.setenv("BENCH_JWKS", jwks)
    result: dict[str, Load] = {}

    def run() -> None:
        result.update(trio.run(_side_by_side, calls, token))

    benchmark.pedantic(run, rounds=1, iterations=1)
    ratio = result["jwt"].cpu_ms_per_call / result["open"].cpu_ms_per_call
    for variant, load in result.items():
        print(f"\n{variant:5} {load.calls_per_s:8.0f} calls/s  {load.cpu_ms_per_call:.3f} server CPU ms/call")
        benchmark.extra_info[f"{variant}_cpu_ms_per_call"] = round(load.cpu_ms_per_call, 3)
    print(f"jwt / open: {ratio:.2f}x")
    benchmark.extra_info["ratio"] = round(ratio, 3)
    assert result["jwt"].calls > 0 and result["open"].calls > 0
    if not benchmark.disabled:
        assert ratio <= 1.1, f"a JWT-authenticated call costs {ratio:.2f}x an unauthenticated one (goal: 1.1x)"
