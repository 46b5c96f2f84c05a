"""Google Secret Manager for NoETL's ``secrets`` tasks of ``provider: google`` (NoETL 1.0's ``SecretManager``,
``noetl/secret.py`` of 2025-07), on mcpipe's ``http`` kind under the operator's outbound policy.

As NoETL reads a secret: the project is the task's ``project_id``, else the one a ``projects/P/secrets/S`` name
holds, else ``GOOGLE_CLOUD_PROJECT`` of the context or the environment, else the credentials' ``quota_project_id``;
the request is ``GET {endpoint}/v1/projects/P/secrets/S/versions/V:access`` (``V`` the task's ``version``, default
``latest``; the task's ``api_endpoint`` replaces the whole URL) with a bearer token of Google's application default
credentials; the secret is the answer's ``payload.data``, base64-decoded; a 404 answers NoETL's fallback value.

The credentials are the file ``GOOGLE_APPLICATION_CREDENTIALS`` names, as Google's libraries read it: a service
account's key (``client_email``, ``private_key``, ``private_key_id``, ``token_uri``: a JWT signed with the key is
exchanged for a token, RFC 7523) or a user's refresh token (``client_id``, ``client_secret``, ``refresh_token``).
The endpoint is ``CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER`` (gcloud's override) when it is set, else Google's;
the token endpoint is the credentials' ``token_uri``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import orjson

__all__ = ["ENDPOINT_ENV", "GoogleError", "access_url", "credentials", "project_of", "secret_of", "token_request"]

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
DEFAULT_ENDPOINT = "https://secretmanager.googleapis.com"
DEFAULT_TOKEN_URI = "https://oauth2.googleapis.com/token"
ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER"
CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
GRANT_JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
MAX_CREDENTIALS_BYTES = 64 * 1024


class GoogleError(Exception):
    """A secret cannot be read (no credentials, no project, an answer that is not Google's): NoETL's error text."""

    @classmethod
    def auth(cls, why: str) -> GoogleError:
        """No token for the credentials, and why (NoETL's ``Failed to authenticate with Google: ...``)."""
        return cls(f"Failed to authenticate with Google: {why}")


def credentials() -> dict[str, Any]:
    """The application default credentials (the file ``GOOGLE_APPLICATION_CREDENTIALS`` names).

    Raises:
        GoogleError: not set, not readable, or not a service account's or a user's credentials.
    """
    path = os.environ.get(CREDENTIALS_ENV, "")
    if not path:
        raise GoogleError.auth(f"no application default credentials ({CREDENTIALS_ENV} is not set)")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CREDENTIALS_BYTES + 1)
    except OSError as e:
        raise GoogleError.auth(f"cannot read {CREDENTIALS_ENV}: {e.strerror}") from None
    try:
        creds = orjson.loads(data) if len(data) <= MAX_CREDENTIALS_BYTES else None
    except orjson.JSONDecodeError:
        creds = None
    if not isinstance(creds, dict) or creds.get("type") not in ("service_account", "authorized_user"):
        raise GoogleError.auth(f"{CREDENTIALS_ENV} is not a service account's or a user's credentials")
    return creds


def token_request(creds: Mapping[str, object], now: float | None = None) -> tuple[str, str]:
    """``(token endpoint, form body)`` asking for an access token with the credentials.

    Raises:
        GoogleError: the credentials lack a field, or the service account's key cannot sign.
    """
    import jwt

    uri = str(creds.get("token_uri") or DEFAULT_TOKEN_URI)
    if creds.get("type") == "authorized_user":
        fields = {k: creds.get(k) for k in ("client_id", "client_secret", "refresh_token")}
        if not all(isinstance(v, str) and v for v in fields.values()):
            raise GoogleError.auth("the user's credentials lack a field")
        return uri, urlencode({"grant_type": "refresh_token", **fields})
    email, key = creds.get("client_email"), creds.get("private_key")
    if not isinstance(email, str) or not isinstance(key, str):
        raise GoogleError.auth("the service account's key lacks `client_email` or `private_key`")
    issued = int(now if now is not None else time.time())
    claims = {"iss": email, "scope": SCOPE, "aud": uri, "iat": issued, "exp": issued + 3600}
    headers = {"kid": creds["private_key_id"]} if isinstance(creds.get("private_key_id"), str) else None
    try:
        assertion = jwt.encode(claims, key, algorithm="RS256", headers=headers)
    except (ValueError, TypeError, jwt.PyJWTError) as e:
        raise GoogleError.auth(f"the service account's key cannot sign: {e}") from None
    return uri, urlencode({"grant_type": GRANT_JWT_BEARER, "assertion": assertion})


def project_of(
    project: object, name: str, context: Mapping[str, object], creds: Mapping[str, object]
) -> tuple[str, str]:
    """``(project, secret name)`` as NoETL finds them (see the module).

    Raises:
        GoogleError: no project anywhere.
    """
    project = str(project or "")
    if not project and name.startswith("projects/") and "/secrets/" in name:
        parts = name.split("/")
        if len(parts) >= 4 and parts[2] == "secrets":
            project, name = parts[1], parts[3]
    if not project:
        project = str(context.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("GOOGLE_CLOUD_PROJECT") or "")
    if not project:
        project = str(creds.get("quota_project_id") or "")
    if not project:
        raise GoogleError("Project ID is required for Google Secret Manager.")
    return project, name


def access_url(project: str, name: str, version: str) -> str:
    """``{endpoint}/v1/projects/P/secrets/S/versions/V:access`` (the endpoint gcloud's override, else Google's)."""
    base = (os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    segs = [quote(s, safe="") for s in (project, name, version)]
    return f"{base}/v1/projects/{segs[0]}/secrets/{segs[1]}/versions/{segs[2]}:access"


def secret_of(body: object, version: str) -> dict[str, Any]:
    """NoETL's ``data`` of a secret read: ``{secret_value, version}`` from Google's ``AccessSecretVersionResponse``.

    Raises:
        GoogleError: the answer holds no base64 ``payload.data``.
    """
    import base64
    import binascii

    if isinstance(body, str):
        body = {"text": body}
    data = (body.get("payload") or {}).get("data", "") if isinstance(body, Mapping) else ""
    value: Any = data
    if isinstance(data, str):
        try:
            value = base64.b64decode(data, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise GoogleError("the secret's payload is not base64 UTF-8 text") from None
    return {"secret_value": value, "version": body.get("version", version) if isinstance(body, Mapping) else version}
