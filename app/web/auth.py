"""Who is calling: API key -> member, or read token -> the member whose key minted it. With no keys configured,
everyone is the member ``public``.

A read token (app.web.tokens) comes as ``Authorization: Bearer tpr.…`` or, where a header cannot be set (an
``EventSource``, a plain link), as ``?access_token=tpr.…`` (RFC 6750). :func:`init_app`'s hook verifies it before
anything else reads the caller, and lets it reach only what it reads (:data:`TASK_READS`, :data:`BATCH_READS`, with
GET): a write or another route is 403 ``insufficient_scope``, another task's or batch's id 404 as a foreign one
is, a token that does not count 401 ``invalid_token``. The query parameter is taken out of the query string the
views read (a page's own parameters are checked strictly), and out of every log line (app.core.logs).
"""

from __future__ import annotations

import hmac
import logging
from urllib.parse import parse_qsl, unquote_plus, urlencode

from flask import Flask, Request, g, request

from app.core.clock import now_ms
from app.core.config import Config
from app.core.config_keys import READ_TOKEN_PREFIX
from app.core.states import HIGH_QUEUE
from app.web.errors import AppError, BadRequest, Unauthorized, task_not_found
from app.web.tokens import TASK, InvalidToken, Scope, Tokens, task_batches

OPEN_MEMBER = "public"
PASSED_HOSTS_KEPT = 64  # distinct allowed Host headers remembered per app (see init_app)
log = logging.getLogger(__name__)
TOKEN_PARAM = "access_token"  # RFC 6750's query parameter
ALONE = f"{TOKEN_PARAM}="
# What a read token may call, with GET (or HEAD): its task's documents; a batch's token also the batch's own
# documents, and these of each of its tasks. ``output.output`` is the live output's (GET /tasks/{id}/output).
TASK_READS = frozenset({"tasks.status", "events.events", "tasks.result", "tasks.result_file", "output.output"})
BATCH_READS = frozenset({"batches.status", "batches.tasks", "batches.events"})
READ_METHODS = frozenset({"GET", "HEAD"})
# Blueprints that read no credentials at all (health, the documents, the page): a token sent there is not looked at.
NO_CREDENTIALS = frozenset({"health", "docs", "api_docs", "page"})


class Forbidden(AppError):
    status, slug, title = 403, "forbidden", "Not allowed for this API key"


class InsufficientScope(AppError):
    status, slug, title = 403, "insufficient-scope", "Not allowed for this read token"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer error="insufficient_scope"'})


def invalid_token(detail: str) -> Unauthorized:
    return Unauthorized(detail, slug="invalid-token", title="Invalid read token",
                        headers={"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{detail}"'})


class Members:
    def __init__(self, config: Config, tokens: Tokens) -> None:
        self.grants = config.grants
        self.keys = config.members
        self.tokens = tokens
        if not self.keys:
            log.warning("no TASKPORT_API_KEYS configured: open development mode, every caller is %r", OPEN_MEMBER)

    def current(self) -> str:
        """The calling member, from ``Authorization: Bearer <key>``; 401 for a missing or unknown key. In open mode
        ``public``, read token or not (a token minted in open mode reads as ``public``: app.web.tokens), without
        looking at ``g`` (a proxy read, ~0.5 µs of every status read)."""
        if not self.grants:
            return OPEN_MEMBER
        return self._caller()[0]

    def check_priority(self, priority: str | None) -> None:
        """403 naming ``priority`` when the calling key may not submit ``priority: high``.

        Only keys listed as ``key:member:high`` may; in open mode the one trusted user (``public``) may."""
        if priority == HIGH_QUEUE and not self._caller()[1]:
            raise Forbidden("this API key may not submit priority high (TASKPORT_API_KEYS key:member:high)",
                            errors={"priority": ["This API key may not submit priority high."]})

    def minting_key(self) -> str | None:
        """The API key of this request, which a read token minted now will depend on (None in open mode)."""
        self._caller()
        return g.get("taskport_key")

    def _caller(self) -> tuple[str, bool]:
        cached: tuple[str, bool] | None = g.get("taskport_caller")  # a key's, or a read token's (see init_app)
        if cached is not None:
            return cached
        if not self.grants:
            return OPEN_MEMBER, True
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token:
            for key, grant in self.grants.items():
                if hmac.compare_digest(key.encode(), token.strip().encode()):
                    g.taskport_caller = grant
                    g.taskport_key = key
                    return grant
        raise Unauthorized("send Authorization: Bearer <api key>", headers={"WWW-Authenticate": "Bearer"})

    def use_token(self, token: str) -> Scope:
        """Verify ``token`` (401 when it does not count) and make it this request's caller: its member, who may not
        submit ``priority: high`` (a token submits nothing anyway)."""
        try:
            scope = self.tokens.verify(token, now_ms())
        except InvalidToken as exc:
            raise invalid_token(str(exc)) from None
        ctx = g._get_current_object()  # type: ignore[attr-defined]
        ctx.taskport_caller = (scope.member, False)
        ctx.taskport_scope = scope
        return scope


def presented_token(req: Request) -> str | None:
    """The read token ``req`` carries (header or query), None when it carries none; 400 for two parameters. With
    an Authorization header the header counts and the parameter is ignored. The ``access_token`` parameter is
    removed from the query string the views read."""
    environ = req.environ
    header: str = environ.get("HTTP_AUTHORIZATION", "")
    query: str = environ.get("QUERY_STRING", "")
    if TOKEN_PARAM not in query:
        # the key path: two substring tests (no key starts with the prefix: app.core.config)
        return _bearer_token(header) if READ_TOKEN_PREFIX in header else None
    if query.startswith(ALONE) and "&" not in query:  # an EventSource's URL: the token is the whole query
        sent, rest = [unquote_plus(query[len(ALONE):])], ""
    else:
        pairs = parse_qsl(query, keep_blank_values=True)
        sent = [value for name, value in pairs if name == TOKEN_PARAM]
        rest = urlencode([(name, value) for name, value in pairs if name != TOKEN_PARAM])
    if not sent:  # the text appeared elsewhere (another parameter's value)
        return _bearer_token(header)
    if len(sent) > 1:
        raise BadRequest("send one access_token", errors={TOKEN_PARAM: ["Send one token."]})
    environ["QUERY_STRING"] = rest
    req.query_string = rest.encode("latin-1")  # what werkzeug parses request.args from
    req.__dict__.pop("args", None)  # its cached parse of the old query string, if any
    # An Authorization header (a key, or a token) is the credential; a parameter beside it is ignored
    return _bearer_token(header) if header else sent[0]


def _bearer_token(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value.startswith(READ_TOKEN_PREFIX) else None


def check_scope(members: Members, scope: Scope, req: Request) -> None:
    """403 unless ``req`` is a read ``scope`` allows; 404 for another task's or batch's id (as a foreign one)."""
    if req.method not in READ_METHODS:
        raise InsufficientScope("a read token may only read: send the member's API key for this")
    endpoint = req.endpoint
    args = req.view_args or {}
    if endpoint in TASK_READS:
        task_id = args.get("task_id", "")
        if (task_id != scope.id) if scope.kind == TASK else (scope.id not in task_batches(members.tokens.redis,
                                                                                         task_id)):
            raise task_not_found()
        return
    if endpoint in BATCH_READS and scope.kind != TASK:
        if args.get("batch_id") != scope.id:
            from app.web.batch_service import batch_not_found  # here: it imports this module (through intake)

            raise batch_not_found()
        return
    raise InsufficientScope(f"a read token reads its {'task' if scope.kind == TASK else 'batch'} only: "
                            "send the member's API key for this")


def init_app(app: Flask, config: Config, members: Members) -> None:
    """Verify a read token before any other hook reads the caller (:func:`check_scope`); a preflight (OPTIONS)
    carries none and is left to app.web.cors.

    In open mode (no API keys) answer only requests addressed to one of our own host names.

    A page on another site can make a browser resolve its own name to 127.0.0.1 (DNS rebinding) and then
    call the service as if it were same-origin; the Host header still carries the other site's name.
    With API keys the key is the protection, so any Host is fine (proxies and platforms rewrite it).
    """

    def read_token(req: Request) -> None:
        token = presented_token(req)
        if token is None or req.method == "OPTIONS":
            return
        if req.blueprint in NO_CREDENTIALS or req.endpoint == "static":
            return
        check_scope(members, members.use_token(token), req)

    if config.members:
        @app.before_request
        def _read_token() -> None:
            read_token(request._get_current_object())  # type: ignore[attr-defined]  # once: each proxy read costs

        return
    allowed = config.open_hosts
    # Host headers already let through (the answer depends on the header alone): a set lookup per
    # request instead of werkzeug's host parsing; bounded, since a client chooses the header
    passed: set[str] = set()

    # open mode: the token's check, then the Host's, in one hook (a hook and a proxy read fewer a request)
    @app.before_request
    def _read_token_and_check_host() -> None:
        req: Request = request._get_current_object()  # type: ignore[attr-defined]
        read_token(req)
        raw = req.environ.get("HTTP_HOST")
        if raw in passed:
            return
        name = req.host.rsplit(":", 1)[0] if not req.host.endswith("]") else req.host
        if name.lower() in allowed:
            if raw is not None and len(passed) < PASSED_HOSTS_KEPT:
                passed.add(raw)
            return
        raise BadRequest(
            "this Host is not one the service answers in open mode; add it to TASKPORT_ALLOWED_HOSTS",
            errors={"Host": [f"Not one of: {', '.join(sorted(allowed))}."]})
