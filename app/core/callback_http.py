"""Where a callback may go, and the one HTTP request of a delivery attempt: the no-SSRF rule in code.

The policy (:func:`resolve`, and :func:`refusal` for the submit's 422): https only; no user name or password in
the URL; every address the host resolves to must be public (not loopback, private, link-local, site-local,
multicast, reserved, unspecified, shared 100.64/10, documentation, Teredo, nor one of those inside an
IPv4-mapped, 6to4 or NAT64 address),
unless the host is listed in TASKPORT_CALLBACK_ALLOW_HOSTS, which also permits plain http for it. It runs at
submit and again before every attempt, because what a name resolves to can change.

The request (:func:`post`) goes to an address the policy just checked: it is *pinned*, never looked up again,
so a DNS server that answers a public address to the check and a private one to the connect (rebinding)
gains nothing. TLS is still verified against the host name of the URL (SNI and the certificate's name). It
follows no redirect (a 3xx is a failed attempt), takes at most ``timeout`` seconds from connect to answer
(a watchdog cuts the socket of a receiver that trickles its answer byte by byte) and reads at most
``MAX_ANSWER`` bytes of the body before it closes the connection: the status is all that counts.

urllib3 rather than httpx (both installed): its connection takes the address to connect to apart from the
name TLS verifies (``server_hostname``), which is exactly the pinning, and it has no connection pool, proxy
from the environment or redirect handling of its own in the way at that level. httpx gets there only through
httpcore's ``sni_hostname`` extension and a transport of our own.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

import urllib3.exceptions
from urllib3.connection import HTTPConnection, HTTPSConnection

from app.core.config import Config

MAX_URL = 2048  # characters of a callback URL
MAX_ANSWER = 64 * 1024  # bytes of a receiver's answer read at most (then the connection is closed)
USER_AGENT = "taskport-callbacks"
DEFAULT_PORTS = {"https": 443, "http": 80}
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known NAT64 prefix: an IPv4 address in its last 32 bits

# Not public, though the ipaddress table of some Python versions says global: IPv6 documentation (RFC 9637).
NOT_PUBLIC = (ipaddress.ip_network("3fff::/20"),)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(ValueError):
    """A callback URL the policy refuses; ``str(exc)`` is one sentence for the client."""


@dataclass(frozen=True)
class Target:
    """A callback URL the policy accepted, and the addresses it checked (the only ones :func:`post` connects to)."""

    scheme: str
    host: str  # as the URL names it, lower case (an IPv6 address without brackets): Host, SNI, certificate
    port: int
    path: str  # path and query
    addresses: tuple[str, ...]

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == DEFAULT_PORTS[self.scheme] else f"{name}:{self.port}"


class Answer(NamedTuple):
    """What one attempt got: the HTTP status (None: no answer) and, without one, why (for the log)."""

    status: int | None
    error: str = ""

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def is_public(address: IPAddress) -> bool:
    """Whether a callback may go to ``address``: a global unicast one, judged by the IPv4 address inside an
    IPv4-mapped, 6to4 or NAT64 one (so ``::ffff:10.0.0.1`` is as private as ``10.0.0.1``).

    Beside :mod:`ipaddress`'s own table (whose ``is_global`` changes with the Python version), refused by name:
    site-local IPv6 (``fec0::/10``: deprecated, but still routed inside some sites, and ``is_global`` in Python
    3.11), every Teredo address (``2001::/32``: reaching it goes through a relay to an address no check can
    see), and the ranges of :data:`NOT_PUBLIC`."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if inner is None and address in NAT64:
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None:
            return is_public(inner)
        if address.is_site_local or address.teredo is not None:
            return False
    return address.is_global and not (
        address.is_private or address.is_loopback or address.is_link_local or address.is_multicast
        or address.is_reserved or address.is_unspecified or any(address in net for net in NOT_PUBLIC))


def refusal(url: str, config: Config) -> str | None:
    """Why ``url`` may not be a callback URL (one sentence for the client), or None when it may."""
    try:
        resolve(url, config)
    except Refused as exc:
        return str(exc)
    return None


def resolve(url: str, config: Config) -> Target:
    """``url`` as a :class:`Target`, its host resolved and its addresses checked; raises Refused."""
    scheme, host, port, path = _parts(url)
    allowed = host in config.callback_hosts
    if scheme != "https" and not (scheme == "http" and allowed):
        raise Refused("A callback URL must use https (plain http only for a host the operator lists in "
                      "TASKPORT_CALLBACK_ALLOW_HOSTS).")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise Refused("The callback URL's host does not resolve.") from None
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in found))  # in the resolver's order, once each
    if not addresses:
        raise Refused("The callback URL's host does not resolve.")
    if not allowed and not all(is_public(ipaddress.ip_address(a.partition("%")[0])) for a in addresses):
        raise Refused("The callback URL's host resolves to a non-public address (loopback, private, link-local "
                      "or reserved): callbacks go to public addresses only.")
    return Target(scheme, host, port, path, addresses)


def _parts(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path and query) of an absolute URL without user info; raises Refused."""
    if len(url) > MAX_URL or not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise Refused("Not a callback URL: too long, or it holds spaces, control or non-ASCII characters "
                      "(percent-encode them; an international host name in its xn-- form).")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed [ of an IPv6 address
        raise Refused("Not an absolute https URL, e.g. https://example.com/hooks/taskport.") from None
    try:
        port = parts.port
    except ValueError:
        raise Refused("The callback URL's port is not a valid port.") from None
    if parts.scheme not in DEFAULT_PORTS or not host:
        raise Refused("Not an absolute https URL, e.g. https://example.com/hooks/taskport.")
    if "@" in parts.netloc:
        raise Refused("A callback URL may not hold a user name or password.")
    path = parts.path or "/"
    return parts.scheme, host, port or DEFAULT_PORTS[parts.scheme], f"{path}?{parts.query}" if parts.query else path


def post(target: Target, body: bytes, headers: dict[str, str], timeout: float,
         ssl_context: ssl.SSLContext | None = None) -> Answer:
    """POST ``body`` to ``target`` at one of its checked addresses (in order, until one connects). ``ssl_context``:
    the system's trust store and host name check by default (a test passes one that trusts its own CA)."""
    deadline = time.monotonic() + timeout
    headers = {**headers, "Host": target.host_header, "User-Agent": USER_AGENT}
    error = "no address"
    for address in target.addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            return Answer(None, "timed out")
        conn = _connection(target, address, left, ssl_context)
        try:
            conn.connect()
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            conn.close()
            error = _why(exc)
            continue
        return _exchange(conn, target, body, headers, deadline)
    return Answer(None, error)


def _connection(target: Target, address: str, timeout: float,
                ssl_context: ssl.SSLContext | None) -> HTTPConnection:
    if target.scheme == "http":
        return HTTPConnection(address, target.port, timeout=timeout)
    return HTTPSConnection(address, target.port, timeout=timeout, server_hostname=target.host,
                           ssl_context=ssl_context or _system_trust())


@functools.cache
def _system_trust() -> ssl.SSLContext:
    """The system's trust store, certificates required, host names checked: loaded once per process."""
    return ssl.create_default_context()


def _exchange(conn: HTTPConnection, target: Target, body: bytes, headers: dict[str, str], deadline: float) -> Answer:
    """Send the request on the connected ``conn`` and read the answer, all before ``deadline``; then close. An
    answer the watchdog cut short is no answer, whatever its first line said."""
    cut = threading.Event()
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _cut, (conn, cut))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("POST", target.path, body=body, headers=headers, preload_content=False, decode_content=False)
        answer = conn.getresponse()
        answer.read(MAX_ANSWER, decode_content=False)
        status: int | None = answer.status
        error = ""
    except (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError) as exc:
        status, error = None, _why(exc)
    finally:
        watchdog.cancel()
        conn.close()
    return Answer(None, "timed out") if cut.is_set() else Answer(status, error)


def _cut(conn: HTTPConnection, cut: threading.Event) -> None:
    """The deadline passed: shut the socket down, which ends a read blocked on it at once."""
    cut.set()
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _OneLine(logging.Filter):
    """urllib3 logs a receiver's malformed header block as a warning *with its traceback*: a known condition (the
    receiver's fault, or the watchdog's cut), so the warning stays and the traceback goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Failed to parse headers"):
            record.exc_info = None
        return True


logging.getLogger("urllib3.connection").addFilter(_OneLine())


def _why(exc: BaseException) -> str:
    """A short reason for the log: the error's class and first line, never a traceback."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate not accepted: {exc.verify_message}"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__
