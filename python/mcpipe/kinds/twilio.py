"""The ``twilio`` step kind: one operation of Twilio's REST API, as mcpg's ``dev.mcpg.backend.twilio`` binding.

``operation`` picks the call; the step's input (``arguments``, default the call's ``args``) carries its
arguments, as a tool binding's arguments in mcpg:

| operation | Twilio call |
|---|---|
| ``send_sms`` | ``POST Accounts/{AC}/Messages.json`` (``to``, ``body``, ``from``, ``media_url``...) |
| ``list_messages`` / ``list_calls`` | ``GET Messages.json`` / ``Calls.json``: ``{messages|calls, next_page_uri}`` |
| ``get_message`` / ``get_call`` / ``get_recording`` | ``GET .../{sid}.json`` (a SID: 2 capitals, 32 hex) |
| ``redact_message`` / ``delete_message`` | ``POST`` with ``Body=""`` / ``DELETE`` |
| ``make_call`` | ``POST Calls.json`` (``twiml_verbs`` rendered, or ``twiml``, or an https ``url``) |
| ``modify_call`` | ``POST Calls/{sid}.json`` (``action``: ``hangup``, or ``redirect`` to verbs or a URL) |
| ``lookup`` | ``GET lookups/v2/PhoneNumbers/{phone}`` (``fields``) |
| ``verify_start`` / ``verify_check`` | ``POST verify/v2/Services/{VA}/Verifications`` / ``VerificationCheck`` |
| ``configure_number_webhooks`` | ``POST IncomingPhoneNumbers/{sid}.json`` |
| ``build_twiml`` | no call: ``{twiml}`` rendered from ``twiml_verbs`` |
| ``stage_call_response`` | refused at load: mcpg keeps verbs for its inbound-voice webhook, not served here |

Requests authenticate with HTTP Basic: an API key (``api_key_sid`` + ``api_key_secret``) or the account's
``auth_token``; either secret may name a ``[credentials.NAME]`` instead (``*_credential``). Twilio's own
errors (``{code, message, more_info}``) fail the step as ``TOOL_ERROR`` (``Twilio error 21211: ...``); a 429 or
5xx is retried twice (honouring ``Retry-After``, at most 5 s), and a transport failure fails it as
``TOOL_FAILED``. Every request goes through the operator's outbound HTTP policy (``outbound.http``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from html import escape
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlencode

import msgspec
import orjson
import trio

from mcpipe._template import Template
from mcpipe.access import CredentialError, Credentials
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._policy import HttpPolicy
from mcpipe.kinds._wire import payload
from mcpipe.kinds.http import send_request
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "TwilioFields", "render_twiml"]

Operation = Literal[
    "send_sms",
    "list_messages",
    "get_message",
    "redact_message",
    "delete_message",
    "make_call",
    "list_calls",
    "get_call",
    "modify_call",
    "get_recording",
    "lookup",
    "verify_start",
    "verify_check",
    "build_twiml",
    "stage_call_response",
    "configure_number_webhooks",
]
_LOCAL = frozenset({"build_twiml", "stage_call_response"})
MAX_RETRIES = 2
MAX_RETRY_AFTER_S = 5.0


class TwilioFields(StepFields, tag="twilio"):
    """One Twilio operation (see the module docstring); every field but ``arguments`` is a constant."""

    operation: Operation
    account_sid: str
    api_key_sid: str | None = None
    api_key_secret: str | None = None
    api_key_secret_credential: str | None = None
    auth_token: str | None = None
    auth_token_credential: str | None = None
    from_: str | None = msgspec.field(default=None, name="from")
    messaging_service_sid: str | None = None
    surface: Literal["tool", "resource", "prompt"] = "tool"
    uri: str | None = None
    api_base: str = "https://api.twilio.com"
    lookups_base: str = "https://lookups.twilio.com"
    verify_base: str = "https://verify.twilio.com"
    verify_service_sid: str | None = None
    page_size: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 50
    max_response_bytes: Annotated[int, msgspec.Meta(ge=1)] = 256 * 1024
    arguments: Any = msgspec.UNSET


@dataclass(frozen=True, slots=True)
class TwilioPlan:
    arguments: Template
    http: HttpPolicy
    credentials: Credentials


# -- TwiML ------------------------------------------------------------------------------------------------

_VERB_FIELDS: dict[str, frozenset[str]] = {
    "say": frozenset({"text", "voice", "language"}),
    "play": frozenset({"url"}),
    "gather": frozenset({"input", "action", "num_digits", "speech_timeout", "timeout", "nested"}),
    "record": frozenset({"action", "max_length", "play_beep"}),
    "dial": frozenset({"number", "sip", "client", "conference", "caller_id"}),
    "reject": frozenset({"reason"}),
    "hangup": frozenset(),
    "pause": frozenset({"length"}),
    "redirect": frozenset({"url"}),
    "message": frozenset({"body", "media_url"}),
}
_REQUIRED = {"say": ("text",), "play": ("url",), "redirect": ("url",), "message": ("body",)}
_NUMBERS = {"num_digits", "timeout", "max_length", "length"}
HEADER = '<?xml version="1.0" encoding="UTF-8"?>'


class TwimlError(ValueError):
    """Verbs that are not TwiML verbs as mcpg writes them (``{"verb": "say", "text": ...}``)."""


def _esc(text: str) -> str:
    return escape(text, quote=True).replace("&#x27;", "&apos;")


def _attr(name: str, value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return f' {name}="{str(value).lower()}"'
    return f' {name}="{_esc(str(value))}"'


def _check_verb(verb: object, where: str) -> dict[str, Any]:
    if not isinstance(verb, Mapping):
        raise TwimlError(f"{where}: a verb is an object with a `verb`, got {type(verb).__name__}")
    kind = verb.get("verb")
    if not isinstance(kind, str):
        raise TwimlError(f"{where}: missing field `verb`")
    allowed = _VERB_FIELDS.get(kind)
    if allowed is None:
        raise TwimlError(f"{where}: unknown verb `{kind}` ({', '.join(_VERB_FIELDS)})")
    for key in verb:
        if key != "verb" and key not in allowed:
            raise TwimlError(f"{where}: unknown field `{key}` of `{kind}`")
    for key in _REQUIRED.get(kind, ()):
        if not isinstance(verb.get(key), str):
            raise TwimlError(f"{where}: `{kind}` needs `{key}` (a string)")
    for key in _NUMBERS & verb.keys():
        v = verb[key]
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise TwimlError(f"{where}: `{key}` is a non-negative integer")
    return dict(verb)


def _render_verb(verb: Mapping[str, object], out: list[str], where: str) -> None:
    v = _check_verb(verb, where)
    match v["verb"]:
        case "say":
            out.append(
                f"<Say{_attr('voice', v.get('voice'))}{_attr('language', v.get('language'))}>{_esc(v['text'])}</Say>"
            )
        case "play":
            out.append(f"<Play>{_esc(v['url'])}</Play>")
        case "gather":
            attrs = (
                _attr("input", v.get("input"))
                + _attr("action", v.get("action"))
                + _attr("numDigits", v.get("num_digits"))
                + _attr("speechTimeout", v.get("speech_timeout"))
                + _attr("timeout", v.get("timeout"))
            )
            out.append(f"<Gather{attrs}>")
            nested = v.get("nested") or []
            if not isinstance(nested, list):
                raise TwimlError(f"{where}.nested: a list of verbs")
            for i, child in enumerate(nested):
                _render_verb(child, out, f"{where}.nested[{i}]")
            out.append("</Gather>")
        case "record":
            attrs = (
                _attr("action", v.get("action"))
                + _attr("maxLength", v.get("max_length"))
                + _attr("playBeep", v.get("play_beep"))
            )
            out.append(f"<Record{attrs}/>")
        case "dial":
            inner = ""
            if v.get("number") is not None:
                inner = _esc(str(v["number"]))
            elif v.get("sip") is not None:
                inner = f"<Sip>{_esc(str(v['sip']))}</Sip>"
            elif v.get("client") is not None:
                inner = f"<Client>{_esc(str(v['client']))}</Client>"
            elif v.get("conference") is not None:
                inner = f"<Conference>{_esc(str(v['conference']))}</Conference>"
            out.append(f"<Dial{_attr('callerId', v.get('caller_id'))}>{inner}</Dial>")
        case "reject":
            out.append(f"<Reject{_attr('reason', v.get('reason'))}/>")
        case "hangup":
            out.append("<Hangup/>")
        case "pause":
            out.append(f"<Pause{_attr('length', v.get('length'))}/>")
        case "redirect":
            out.append(f"<Redirect>{_esc(v['url'])}</Redirect>")
        case "message":
            media = v.get("media_url") or []
            if not isinstance(media, list) or not all(isinstance(m, str) for m in media):
                raise TwimlError(f"{where}.media_url: a list of URLs")
            parts = "".join(f"<Media>{_esc(m)}</Media>" for m in media)
            out.append(f"<Message><Body>{_esc(v['body'])}</Body>{parts}</Message>")


def render_twiml(verbs: object, where: str = "twiml_verbs") -> str:
    """TwiML of an ordered list of verbs (mcpg's rendering, byte for byte).

    Raises:
        TwimlError: a verb that is not one (located under ``where``).
    """
    if not isinstance(verbs, list):
        raise TwimlError(f"{where}: a list of verbs, got {type(verbs).__name__}")
    out: list[str] = []
    for i, verb in enumerate(verbs):
        _render_verb(verb, out, f"{where}[{i}]")
    return f"{HEADER}<Response>{''.join(out)}</Response>"


# -- the step ---------------------------------------------------------------------------------------------

_SID = re.compile(r"[A-Z]{2}[0-9a-fA-F]{32}")


class _ToolError(Exception):
    """A logical failure answered as an ``isError`` result (mcpg's ``OpResult::ToolError``)."""


def build_twilio(b: Build[TwilioFields]) -> TwilioPlan:
    """mcpg's checks of a binding, located; the arguments template; the HTTP policy with the binding's cap."""
    f = b.fields
    if f is None:
        b.fail()
    loc = b.location
    if f.operation == "stage_call_response":
        # mcpg keeps the verbs for the next inbound call, which its inbound-voice webhook serves; mcpipe serves
        # no such route, so staged verbs would only be kept (issue 27: 60 x 2 MB of them, 120 MB for good).
        b.problem(
            f"{loc}.operation",
            "stage_call_response is not supported by mcpipe: it keeps TwiML for Twilio's inbound-voice webhook, "
            "which mcpipe does not serve, so nothing would ever take it (answer a call with `make_call`'s "
            "`twiml_verbs`, or `modify_call`)",
        )
    if not f.account_sid.strip():
        b.problem(f"{loc}.account_sid", "account_sid is required")
    for key in ("account_sid", "from_", "verify_service_sid"):
        value = getattr(f, key)
        if isinstance(value, str) and "cred://" in value:
            name = "from" if key == "from_" else key
            b.problem(f"{loc}.{name}", f"{name} must not contain a bare cred:// URI")
    if f.api_key_secret is not None and f.api_key_secret_credential is not None:
        b.problem(f"{loc}.api_key_secret", "set `api_key_secret` or `api_key_secret_credential`, not both")
    if f.auth_token is not None and f.auth_token_credential is not None:
        b.problem(f"{loc}.auth_token", "set `auth_token` or `auth_token_credential`, not both")
    for key in ("api_key_secret_credential", "auth_token_credential"):
        name = getattr(f, key)
        if name is not None and name not in b.policy.credentials:
            b.problem(f"{loc}.{key}", f"no credential `{name}` in [credentials]", ErrorCode.INVALID_CONFIG)
    has_key = bool(f.api_key_sid) and bool(f.api_key_secret or f.api_key_secret_credential)
    has_token = bool(f.auth_token or f.auth_token_credential)
    if f.operation not in _LOCAL and not (has_key or has_token):
        b.problem(loc, "REST operations require either api_key_sid+api_key_secret or auth_token")
    if f.operation == "send_sms" and f.from_ is None and f.messaging_service_sid is None:
        b.problem(loc, "send_sms requires a `from` number or `messaging_service_sid`")
    if f.operation in ("verify_start", "verify_check") and not (f.verify_service_sid or "").strip():
        b.problem(f"{loc}.verify_service_sid", f"{f.operation} requires a `verify_service_sid` (VA...)")
    if f.timeout_ms is not None and f.timeout_ms <= 0:
        b.problem(f"{loc}.timeout_ms", "timeout_ms must be > 0")
    for key in ("api_base", "lookups_base", "verify_base"):
        if not getattr(f, key).startswith(("http://", "https://")):
            b.problem(f"{loc}.{key}", "must be an http:// or https:// URL")
    return TwilioPlan(
        payload(b, "arguments"), replace(b.policy.http, max_response_bytes=f.max_response_bytes), b.policy.credentials
    )


def _str(args: Mapping[str, object], key: str) -> str | None:
    v = args.get(key)
    return v if isinstance(v, str) and v else None


def _req(args: Mapping[str, object], key: str) -> str:
    v = _str(args, key)
    if v is None:
        raise _ToolError(f"missing required argument `{key}`")
    return v


def _sid(args: Mapping[str, object], key: str = "sid") -> str:
    v = _req(args, key)
    if not _SID.fullmatch(v):
        raise _ToolError(
            f"argument `{key}` is not a Twilio SID (expected two uppercase letters followed by 32 hex digits)"
        )
    return v


def _https(field: str, url: str) -> str:
    if not url.startswith("https://"):
        raise _ToolError(f"{field} must be an https:// URL")
    return url


def _verbs(args: Mapping[str, Any]) -> list[Any]:
    verbs = args.get("twiml_verbs")
    if verbs is None:
        return []
    try:
        render_twiml(verbs)
    except TwimlError as exc:
        raise _ToolError(f"invalid twiml_verbs: {exc}") from None
    return list(verbs)


class _Rest:
    def __init__(self, f: TwilioFields, plan: TwilioPlan, user: str, secret: str) -> None:
        self.f, self.plan = f, plan
        token = base64.b64encode(f"{user}:{secret}".encode()).decode()
        self.auth = f"Basic {token}"

    def account(self, suffix: str) -> str:
        return f"{self.f.api_base.rstrip('/')}/2010-04-01/Accounts/{self.f.account_sid}/{suffix}"

    async def send(self, method: str, url: str, form: list[tuple[str, str]] | None = None) -> Any:
        headers = {"authorization": self.auth, "accept": "application/json"}
        content = None
        if form is not None:
            headers["content-type"] = "application/x-www-form-urlencoded"
            content = urlencode(form).encode()
        attempt = 0
        while True:
            try:
                response = await send_request(self.plan.http, method, url, headers=headers, content=content)
            except StepFailure as exc:
                if exc.code == ErrorCode.FORBIDDEN or attempt >= MAX_RETRIES:
                    raise StepFailure(f"twilio: {exc}", exc.code) from None
                attempt += 1
                await trio.sleep(0.25)
                continue
            status, raw = response.status, response.body
            if 200 <= status < 300:
                if not raw.strip():
                    return {"deleted": True}
                try:
                    return orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise StepFailure(f"twilio: malformed JSON response: {exc}", ErrorCode.TOOL_FAILED) from None
            if (status == 429 or status >= 500) and attempt < MAX_RETRIES:
                attempt += 1
                await trio.sleep(_retry_after(response.headers.get("retry-after")))
                continue
            raise _ToolError(_error_text(status, raw))

    async def list(self, suffix: str, query: list[tuple[str, str]], collection: str) -> dict[str, Any]:
        q = urlencode([*query, ("PageSize", str(self.f.page_size))])
        body = await self.send("GET", f"{self.account(suffix)}?{q}")
        items = body.get(collection) if isinstance(body, dict) else None
        nxt = body.get("next_page_uri") if isinstance(body, dict) else None
        return {
            collection: items if isinstance(items, list) else [],
            "next_page_uri": nxt if isinstance(nxt, str) and nxt else None,
        }


def _retry_after(value: str | None) -> float:
    try:
        return min(MAX_RETRY_AFTER_S, float(int(value.strip()))) if value else 0.25
    except ValueError:
        return 0.25


def _error_text(status: int, raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), int) and not isinstance(body.get("code"), bool):
        message = body.get("message") if isinstance(body.get("message"), str) else "Twilio error"
        more = body.get("more_info") if isinstance(body.get("more_info"), str) else ""
        return f"Twilio error {body['code']}: {message}" + (f" ({more})" if more else "")
    return f"Twilio returned HTTP {status}"


async def _secret(plan: TwilioPlan, value: str | None, credential: str | None, ctx: ToolContext) -> str | None:
    if credential is not None:
        try:
            return (await plan.credentials.issue(credential, ctx.identity)).token
        except CredentialError as exc:
            raise StepFailure(str(exc), ErrorCode.TOOL_FAILED) from None
    return value or None


async def _rest(f: TwilioFields, plan: TwilioPlan, ctx: ToolContext) -> _Rest:
    key_secret = await _secret(plan, f.api_key_secret, f.api_key_secret_credential, ctx) if f.api_key_sid else None
    if f.api_key_sid and key_secret:
        return _Rest(f, plan, f.api_key_sid, key_secret)
    token = await _secret(plan, f.auth_token, f.auth_token_credential, ctx)
    if not token:
        raise StepFailure(
            "REST operations require either api_key_sid+api_key_secret or auth_token", ErrorCode.TOOL_FAILED
        )
    return _Rest(f, plan, f.account_sid, token)


async def _dispatch(f: TwilioFields, plan: TwilioPlan, args: Mapping[str, object], ctx: ToolContext) -> Any:
    op = f.operation
    if op == "build_twiml":
        return {"twiml": render_twiml(_verbs(args))}
    rest = await _rest(f, plan, ctx)
    match op:
        case "send_sms":
            form = [("To", _req(args, "to")), ("Body", _req(args, "body"))]
            service = _str(args, "messaging_service_sid") or f.messaging_service_sid
            sender = _str(args, "from") or f.from_
            if service is not None:
                form.append(("MessagingServiceSid", service))
            elif sender is not None:
                form.append(("From", sender))
            else:
                raise _ToolError("send_sms needs `from` or `messaging_service_sid`")
            if (cb := _str(args, "status_callback")) is not None:
                form.append(("StatusCallback", _https("status_callback", cb)))
            media = args.get("media_url")
            for url in media if isinstance(media, list) else []:
                if isinstance(url, str):
                    form.append(("MediaUrl", _https("media_url", url)))
            return await rest.send("POST", rest.account("Messages.json"), form)
        case "list_messages" | "list_calls":
            filters = [("to", "To"), ("from", "From")]
            filters.append(("date_sent", "DateSent") if op == "list_messages" else ("status", "Status"))
            query = [(param, v) for arg, param in filters if (v := _str(args, arg)) is not None]
            collection = "messages" if op == "list_messages" else "calls"
            return await rest.list("Messages.json" if op == "list_messages" else "Calls.json", query, collection)
        case "get_message":
            return await rest.send("GET", rest.account(f"Messages/{_sid(args)}.json"))
        case "redact_message":
            return await rest.send("POST", rest.account(f"Messages/{_sid(args)}.json"), [("Body", "")])
        case "delete_message":
            return await rest.send("DELETE", rest.account(f"Messages/{_sid(args)}.json"))
        case "make_call":
            form = [("To", _req(args, "to"))]
            sender = _str(args, "from") or f.from_
            if sender is None:
                raise _ToolError("make_call needs a `from` number")
            form.append(("From", sender))
            verbs = _verbs(args)
            if verbs:
                form.append(("Twiml", render_twiml(verbs)))
            elif (twiml := _str(args, "twiml")) is not None:
                form.append(("Twiml", twiml))
            elif (url := _str(args, "url")) is not None:
                form.append(("Url", _https("url", url)))
            else:
                raise _ToolError("make_call requires one of `twiml_verbs`, `twiml`, or `url`")
            if (cb := _str(args, "status_callback")) is not None:
                form.append(("StatusCallback", _https("status_callback", cb)))
            events = args.get("status_callback_event")
            form.extend(
                ("StatusCallbackEvent", e) for e in (events if isinstance(events, list) else []) if isinstance(e, str)
            )
            if (md := _str(args, "machine_detection")) is not None:
                form.append(("MachineDetection", md))
            if args.get("record") is True:
                form.append(("Record", "true"))
            return await rest.send("POST", rest.account("Calls.json"), form)
        case "get_call":
            return await rest.send("GET", rest.account(f"Calls/{_sid(args)}.json"))
        case "modify_call":
            sid = _sid(args)
            action = _req(args, "action")
            if action == "hangup":
                form = [("Status", "completed")]
            elif action == "redirect":
                verbs = _verbs(args)
                if verbs:
                    form = [("Twiml", render_twiml(verbs))]
                elif (url := _str(args, "url")) is not None:
                    form = [("Url", _https("url", url))]
                else:
                    raise _ToolError("modify_call redirect requires `twiml_verbs` or `url`")
            else:
                raise _ToolError(f"unknown modify_call action `{action}` (hangup|redirect)")
            return await rest.send("POST", rest.account(f"Calls/{sid}.json"), form)
        case "get_recording":
            return await rest.send("GET", rest.account(f"Recordings/{_sid(args)}.json"))
        case "lookup":
            phone = quote(_req(args, "phone"), safe="-._~")
            url = f"{f.lookups_base.rstrip('/')}/v2/PhoneNumbers/{phone}"
            fields = args.get("fields")
            wanted = [x for x in fields if isinstance(x, str) and x] if isinstance(fields, list) else []
            if wanted:
                url += "?" + urlencode([("Fields", ",".join(wanted))])
            return await rest.send("GET", url)
        case "verify_start" | "verify_check":
            service = quote(f.verify_service_sid or "", safe="-._~")
            if op == "verify_start":
                form = [("To", _req(args, "to")), ("Channel", _str(args, "channel") or "sms")]
                tail = "Verifications"
            else:
                form = [("To", _req(args, "to")), ("Code", _req(args, "code"))]
                tail = "VerificationCheck"
            return await rest.send("POST", f"{f.verify_base.rstrip('/')}/v2/Services/{service}/{tail}", form)
        case "configure_number_webhooks":
            sid = _sid(args)
            form = []
            for arg, param in (("sms_url", "SmsUrl"), ("voice_url", "VoiceUrl"), ("status_callback", "StatusCallback")):
                if (v := _str(args, arg)) is not None:
                    form.append((param, _https(arg, v)))
            if not form:
                raise _ToolError("configure_number_webhooks needs at least one of sms_url/voice_url/status_callback")
            return await rest.send("POST", rest.account(f"IncomingPhoneNumbers/{sid}.json"), form)
    raise _ToolError(f"unknown operation `{op}`")  # pragma: no cover - the fields' Literal refuses it


async def run_twilio(
    step: Leaf[TwilioFields, TwilioPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """One operation; the output is Twilio's JSON answer (or what a local operation makes)."""
    args = step.built.arguments.resolve(env)
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise StepFailure(f"the arguments must be an object, got {type(args).__name__}", ErrorCode.TOOL_ERROR)
    try:
        return StepOutput.of(await _dispatch(step.fields, step.built, args, ctx))
    except _ToolError as exc:
        raise StepFailure(str(exc), ErrorCode.TOOL_ERROR) from None


def _timeout(policy: object) -> float | None:
    return 15_000.0


KIND = Kind("twilio", TwilioFields, run_twilio, build=build_twilio, default_timeout=_timeout)
