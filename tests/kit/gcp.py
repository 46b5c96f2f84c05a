"""A small stand-in for Google's OAuth token endpoint and Secret Manager on 127.0.0.1, speaking their REST
protocols: ``POST /token`` takes RFC 7523's JWT bearer grant (the assertion checked against the service account's
public key: RS256, ``aud`` the token endpoint, the ``cloud-platform`` scope) or a refresh token, and answers
``{access_token, expires_in, token_type}``; ``GET /v1/projects/P/secrets/S/versions/V:access`` with that token
answers ``{name, payload: {data}}`` (Google's ``AccessSecretVersionResponse``), 404 with Google's error
body for a secret it does not hold, 401 without the token. :func:`service_account` writes a service account's key
file (a fresh RSA key) the way Google issues them."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

__all__ = ["SecretManager", "service_account"]

TOKEN = "ya29.stand-in-token"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def service_account(path: Path, token_uri: str, project: str = "noetl-demo-19700101") -> Any:
    """Write a service account's key file at ``path``; answers the public key (to check its assertions)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": project,
                "private_key_id": "key-1",
                "private_key": pem,
                "client_email": f"noetl@{project}.iam.gserviceaccount.com",
                "client_id": "1234567890",
                "token_uri": token_uri,
            }
        )
    )
    return key.public_key()


class SecretManager:
    """The stand-in (see the module): ``secrets`` maps ``(project, name)`` to the secret's text; ``requests``
    records each request's method and path."""

    def __init__(self, secrets: dict[tuple[str, str], str]) -> None:
        self.secrets = secrets
        self.public_key: Any = None
        self.requests: list[tuple[str, str]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json; charset=UTF-8")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                stand_in.requests.append(("POST", self.path))
                if self.path != "/token":
                    return self._send(404, {"error": "not_found"})
                status, body = stand_in.token(form)
                self._send(status, body)

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                stand_in.requests.append(("GET", path))
                if self.headers.get("authorization") != f"Bearer {TOKEN}":
                    return self._send(401, {"error": {"code": 401, "message": "no token", "status": "UNAUTHENTICATED"}})
                status, body = stand_in.access(path)
                self._send(status, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def token(self, form: dict[str, str]) -> tuple[int, Any]:
        if form.get("grant_type") == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            try:
                claims = jwt.decode(
                    form.get("assertion", ""), self.public_key, algorithms=["RS256"], audience=f"{self.url}/token"
                )
            except jwt.PyJWTError as e:
                return 400, {"error": "invalid_grant", "error_description": str(e)}
            if claims.get("scope") != SCOPE:
                return 400, {"error": "invalid_scope"}
        elif form.get("grant_type") != "refresh_token" or not form.get("refresh_token"):
            return 400, {"error": "unsupported_grant_type"}
        return 200, {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}

    def access(self, path: str) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        # v1 / projects / P / secrets / S / versions / V:access
        if len(parts) != 7 or parts[0] != "v1" or not parts[6].endswith(":access"):
            return 404, {"error": {"code": 404, "message": "not a Secret Manager path", "status": "NOT_FOUND"}}
        project, name = unquote(parts[2]), unquote(parts[4])
        value = self.secrets.get((project, name))
        if value is None:
            message = f"Secret [projects/{project}/secrets/{name}] not found or has no versions."
            return 404, {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}}
        data = value.encode()
        return 200, {
            "name": f"projects/{project}/secrets/{name}/versions/1",
            "payload": {"data": base64.b64encode(data).decode()},
        }

    def __enter__(self) -> SecretManager:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
