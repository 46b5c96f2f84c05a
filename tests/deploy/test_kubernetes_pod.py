"""The pods deploy/kubernetes describes, run under podman as the kubelet would run them (there is no cluster
here): the rendered Deployment's mcpipe container and the StatefulSet's Redis, with their args, environment
(the Secret's values, ``$(VAR)`` in args expanded as the kubelet does), user, read-only root filesystem,
dropped capabilities, the ConfigMap mounted read-only and the emptyDirs as tmpfs, on one network where Redis
answers to its Service's name. Then what the cluster would do: the probes' ``GET /healthz`` with a pod
address as Host, an agent through the Service's name with its token, Prometheus scraping ``/metrics`` as the
ServiceMonitor says, and SIGTERM, answered by a clean exit within ``terminationGracePeriodSeconds``.

Needs ``MCPIPE_IMAGE`` and ``MCPIPE_REDIS_IMAGE`` (``make image-test``).
"""

from __future__ import annotations

import base64
import importlib.util
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from kit.containers import image_or_skip, logged, podman, podman_flags
from kit.realservers import free_port

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),  # the SDK client's SSE reader
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

ROOT = Path(__file__).parents[2]
WAIT_S = 180
POD_HOST = "10.1.2.3:8765"  # what the kubelet's probe and Prometheus send as Host: the pod's address
SERVICE_HOST = "mcpipe.mcpipe.svc:8765"


def _rendered(tmp: Path, secrets: dict[str, str]) -> list[dict[str, Any]]:
    spec = importlib.util.spec_from_file_location("check_deploy", ROOT / "scripts/check_deploy.py")
    assert spec is not None and spec.loader is not None
    check_deploy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_deploy)
    env_file = tmp / "secrets.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in secrets.items()))
    problems = check_deploy.Problems()
    docs: list[dict[str, Any]] = check_deploy.render(ROOT / "deploy/kubernetes", problems, secrets_env=env_file)
    assert not problems, problems
    return docs


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _env(container: dict[str, Any], secret: dict[str, str]) -> dict[str, str]:
    env = {}
    for source in container.get("envFrom", []):
        if "secretRef" in source:
            env.update(secret)
    for variable in container.get("env", []):
        ref = variable.get("valueFrom", {}).get("secretKeyRef")
        env[variable["name"]] = secret[ref["key"]] if ref else variable["value"]
    return env


def _expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` in args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def _security(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """The pod's and the container's securityContext as podman options."""
    pod_ctx, ctx = pod["spec"].get("securityContext", {}), container.get("securityContext", {})
    flags = ["--user", f"{pod_ctx['runAsUser']}:{pod_ctx['runAsGroup']}"]
    if ctx.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if ctx.get("capabilities", {}).get("drop") == ["ALL"]:
        flags += ["--cap-drop", "ALL"]
    if ctx.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    return flags


def _volumes(pod: dict[str, Any], container: dict[str, Any], docs: list[dict[str, Any]], tmp: Path) -> list[str]:
    """ConfigMaps as read-only directories of their keys, emptyDirs as tmpfs (writable by the pod's group, as
    ``fsGroup`` makes them), volume claims as tmpfs too."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    flags = []
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        if "configMap" in volume:
            data = _one(docs, "ConfigMap", volume["configMap"]["name"])["data"]
            directory = tmp / mount["name"]
            directory.mkdir(mode=0o755)
            for key, text in data.items():
                (directory / key).write_text(text)
                (directory / key).chmod(0o644)
            flags += ["-v", f"{directory}:{mount['mountPath']}:ro"]
        else:  # emptyDir, or a volumeClaimTemplate's volume
            # `U`: owned by the container's user, writable as fsGroup makes an emptyDir (podman 4.3 ignores mode=)
            flags += ["--tmpfs", f"{mount['mountPath']}:rw,U"]
    return flags


async def _podman(*args: str, check: bool = True) -> str:
    done = await trio.run_process([podman(), *args], capture_stdout=True, capture_stderr=True, check=check)
    return done.stdout.decode().strip()


@asynccontextmanager
async def as_service(url: str, token: str) -> AsyncIterator[Client]:
    """An agent reaching mcpipe through the Service's name (its Host header), with its bearer token."""

    @asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        headers = {"authorization": f"Bearer {token}", "host": SERVICE_HOST}
        async with create_mcp_http_client(headers=headers) as http, streamable_http_client(url, http_client=http) as s:
            yield s

    async with Client(transport()) as client:
        yield client


async def test_the_deployment_s_pod_serves_probes_agents_and_prometheus_and_stops_in_its_grace_period(
    tmp_path: Path,
) -> None:
    image = image_or_skip()
    redis_image = os.environ.get("MCPIPE_REDIS_IMAGE", "docker.io/library/redis:7.4")
    secret = {k: os.urandom(32).hex() for k in ("MCPIPE_STATE_KEY", "MCPIPE_TOKEN_AGENT", "MCPIPE_TOKEN_METRICS")}
    secret["REDIS_PASSWORD"] = os.urandom(16).hex()
    docs = _rendered(tmp_path, secret)
    rendered_secret = _one(docs, "Secret", "mcpipe-secrets")["data"]
    assert {k: base64.b64decode(v).decode() for k, v in rendered_secret.items()} == secret
    deployment, redis_set = _one(docs, "Deployment", "mcpipe"), _one(docs, "StatefulSet", "mcpipe-redis")
    pod, redis_pod = deployment["spec"]["template"], redis_set["spec"]["template"]
    (mcpipe_c,) = pod["spec"]["containers"]
    (redis_c,) = redis_pod["spec"]["containers"]
    redis_service = _one(docs, "Service", "mcpipe-redis")["metadata"]["name"]
    port = free_port()
    network, name, redis_name = f"mcpipe-k8s-{port}", f"mcpipe-pod-{port}", f"mcpipe-redis-{port}"
    flags = podman_flags()
    redis_env = _env(redis_c, secret)
    mcpipe_env = _env(mcpipe_c, secret)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]

    await _podman("network", "create", network)
    try:
        with trio.fail_after(WAIT_S):
            await _podman(
                "run", "-d", "--name", redis_name, *flags, "--network", network,
                "--network-alias", redis_service, *_security(redis_pod, redis_c),
                *_volumes(redis_pod, redis_c, docs, tmp_path),
                *(f"--env={k}={v}" for k, v in redis_env.items()),
                "--entrypoint", "redis-server",  # the official image's entrypoint runs redis-server with these args
                redis_image, *(_expand(a, redis_env) for a in redis_c["args"]),
            )  # fmt: skip
            await _podman(
                "run", "-d", "--name", name, *flags, "--network", network, "-p", f"127.0.0.1:{port}:8765",
                *_security(pod, mcpipe_c), *_volumes(pod, mcpipe_c, docs, tmp_path),
                *(f"--env={k}={v}" for k, v in mcpipe_env.items()),
                image, *(_expand(a, mcpipe_env) for a in mcpipe_c["args"]),
            )  # fmt: skip
            await logged(name, "serving MCP at", 1 + int(mcpipe_env["MCPIPE_WORKERS"]))

            base = f"http://127.0.0.1:{port}"
            probe = mcpipe_c["readinessProbe"]["httpGet"]["path"]
            async with httpx2.AsyncClient(timeout=mcpipe_c["readinessProbe"]["timeoutSeconds"]) as http:
                health = await http.get(base + probe, headers={"host": POD_HOST})
                assert health.status_code == 200 and health.json()["ok"] is True
                anonymous = await http.get(base + "/metrics", headers={"host": POD_HOST})
                assert anonymous.status_code == 401

            async with as_service(f"{base}/mcp", secret["MCPIPE_TOKEN_AGENT"]) as agent:
                answer = await agent.call_tool(
                    "mcp_pipe", {"steps": [{"id": "e", "tool": "echo", "args": {"text": "in the pod"}}]}
                )
                queued = await agent.call_tool(
                    "mcp_pipe", {"background": True, "steps": [{"id": "e", "tool": "echo", "args": {"text": "q"}}]}
                )
            assert answer.structured_content is not None and answer.structured_content["ok"] is True
            assert queued.structured_content is not None
            run_id = queued.structured_content["result"]["run_id"]
            async with as_service(f"{base}/mcp", secret["MCPIPE_TOKEN_AGENT"]) as agent:
                done = await agent.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 30000})
            assert done.structured_content is not None and done.structured_content["ok"] is True  # through Redis

            monitor = _one(docs, "ServiceMonitor", "mcpipe")["spec"]["endpoints"][0]
            token = secret[monitor["authorization"]["credentials"]["key"]]
            async with httpx2.AsyncClient() as http:
                scraped = await http.get(
                    base + monitor["path"], headers={"host": POD_HOST, "authorization": f"Bearer {token}"}
                )
            assert scraped.status_code == 200
            assert 'mcpipe_calls_total{outcome="ok",tool="mcp_pipe"}' in scraped.text

            await _podman("kill", "--signal", "TERM", name)
            with trio.fail_after(grace):
                status = await _podman("wait", name)
            assert status == "0"
            log = await _podman("logs", name)
            assert "Traceback" not in log
    finally:
        await _podman("rm", "-f", name, redis_name, check=False)
        await _podman("network", "rm", "-f", network, check=False)
