"""NoETL's ``verify_ssl: false`` on its own vendored playbook (the Interactive Brokers gateway, whose certificate
is self-signed): allowed to the hosts the operator lists in ``outbound.http.insecure_hosts``, and then the step
reaches only those; without them the playbook is refused at check time. The gateway is a real HTTPS server on
127.0.0.1 with a self-signed certificate made by the test."""

from __future__ import annotations

import datetime
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kit.noetl import UPSTREAM
from mcpipe.formats.noetl import NoetlPlaybook, load_playbook, playbook_tool
from mcpipe.kinds import CommandPolicy, HttpPolicy, StepPolicy

GATEWAY = "tests/fixtures/playbooks/interactive_brokers/ib_gateway_test.yaml"


def _self_signed(tmp: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ib-gateway")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_file), str(key_file)


@contextmanager
def gateway(tmp: Path) -> Iterator[str]:
    """An HTTPS server on 127.0.0.1 answering the gateway's auth status, its certificate self-signed."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"authenticated": True, "connected": True, "competing": False}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*_self_signed(tmp))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def load(insecure: tuple[str, ...]) -> tuple[NoetlPlaybook | None, list[str]]:
    http = HttpPolicy(allowed_hosts=("127.0.0.1",), insecure_hosts=insecure)
    pol = StepPolicy(http=http, command=CommandPolicy(commands={"sh": "/bin/sh"}))
    pb, problems = load_playbook(GATEWAY, base_dir=str(UPSTREAM), policy=pol)
    return (pb if isinstance(pb, NoetlPlaybook) else None), [str(p) for p in problems]


async def test_verification_off_reaches_a_self_signed_gateway_the_operator_lists(tmp_path):
    pb, problems = load(("127.0.0.1",))
    assert problems == [] and pb is not None
    with gateway(tmp_path) as url, trio.fail_after(60):
        answer = await playbook_tool(pb).run({"gateway_url": url})
    (status,) = answer["noetl"]["steps"]["check_gateway_status"]
    assert status["status_code"] == 200 and status["data"]["authenticated"] is True


async def test_a_host_the_operator_did_not_list_is_refused_even_with_verification_off(tmp_path):
    pb, _ = load(("gateway.internal",))
    assert pb is not None
    with gateway(tmp_path) as url, trio.fail_after(60):
        answer = await playbook_tool(pb).run({"gateway_url": url})
    assert "check_gateway_status" in answer["noetl"]["failed_steps"]
    assert "127.0.0.1" in str(answer["noetl"]["steps"]["check_gateway_status"][0])
    assert "list it in outbound.http.insecure_hosts" in str(answer["noetl"]["steps"]["check_gateway_status"][0])


def test_without_insecure_hosts_turning_verification_off_is_refused_at_check_time():
    pb, problems = load(())
    assert pb is None
    assert any("workflow[1].tool.verify_ssl: turning TLS verification off needs" in p for p in problems)
