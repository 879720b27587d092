"""The callback SSRF guard's address rule (app.core.callback_http.is_public), case by case.

Issue 29 finding 10: site-local IPv6 (``fec0::/10``) was accepted, because Python 3.11's ``is_global`` says
True for it. Each case goes through :func:`refusal` too, with the address as the URL's host (a literal: the
resolver hands it back as it is), so the whole submit-time check is what is tested, not just the predicate.
"""

from __future__ import annotations

import ipaddress

import pytest

from app.core.callback_http import is_public, refusal
from app.core.config import Config


def settings() -> Config:
    return Config.from_env({}, redis_url="redis://fake")


NOT_PUBLIC = {
    # IPv6 site-local (deprecated, still routed inside some sites): the finding
    "fec0::1": "site-local", "fec0:0:0:1::1": "site-local", "feff:ffff::1": "site-local (the top of fec0::/10)",
    # IPv4-mapped and IPv4-compatible spellings of loopback and private IPv4
    "::ffff:127.0.0.1": "mapped loopback", "::ffff:10.0.0.1": "mapped private",
    "::ffff:192.168.1.1": "mapped private", "::ffff:169.254.169.254": "mapped metadata address",
    "::ffff:100.64.0.1": "mapped shared (CGNAT)", "::ffff:0.0.0.0": "mapped unspecified",
    "::127.0.0.1": "compatible loopback", "::10.0.0.1": "compatible private", "::8.8.8.8": "compatible (deprecated)",
    "::ffff:0:10.0.0.1": "IPv4-translated (SIIT) private",
    # 6to4 (2002::/16) with a private, loopback or shared IPv4 inside
    "2002:a00:1::1": "6to4 of 10.0.0.1", "2002:7f00:1::1": "6to4 of 127.0.0.1",
    "2002:c0a8:101::1": "6to4 of 192.168.1.1", "2002:6440:1::1": "6to4 of 100.64.0.1",
    "2002:a9fe:a9fe::1": "6to4 of 169.254.169.254",
    # Teredo (2001::/32), whatever it embeds
    "2001:0:4136:e378:8000:63bf:3fff:fdd2": "Teredo", "2001:0:a00:1::1": "Teredo, server 10.0.0.1",
    # NAT64: the well-known prefix with a private IPv4, and the local-use prefix
    "64:ff9b::a00:1": "NAT64 of 10.0.0.1", "64:ff9b::7f00:1": "NAT64 of 127.0.0.1",
    "64:ff9b::a9fe:a9fe": "NAT64 of 169.254.169.254", "64:ff9b:1::8.8.8.8": "local-use NAT64 (RFC 8215)",
    # IPv6 special ranges
    "::": "unspecified", "::1": "loopback", "fe80::1": "link-local", "fc00::1": "unique local",
    "fd12:3456::1": "unique local", "ff02::1": "multicast", "ff0e::1": "global-scope multicast",
    "2001:db8::1": "documentation", "3fff::1": "documentation (RFC 9637)", "100::1": "discard-only",
    "2001:2::1": "benchmarking", "5f00::1": "SRv6 SIDs",
    # IPv4 special ranges
    "0.0.0.0": "unspecified", "0.1.2.3": "this network (0/8)", "127.0.0.1": "loopback",
    "10.0.0.1": "private", "172.16.0.1": "private", "192.168.0.1": "private",
    "100.64.0.1": "shared (CGNAT)", "100.127.255.254": "shared (CGNAT)", "169.254.169.254": "link-local",
    "192.0.0.1": "IETF protocol assignments", "192.0.2.1": "documentation", "198.51.100.1": "documentation",
    "203.0.113.1": "documentation", "198.18.0.1": "benchmarking", "224.0.0.1": "multicast",
    "240.0.0.1": "reserved", "255.255.255.255": "broadcast",
}

PUBLIC = ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111", "2a00:1450:4001::1",
          "::ffff:8.8.8.8", "2002:808:808::1", "64:ff9b::808:808"]  # mapped, 6to4 and NAT64 of a public IPv4


@pytest.mark.parametrize("address", sorted(NOT_PUBLIC), ids=lambda a: f"{a} ({NOT_PUBLIC[a]})")
def test_a_non_public_address_is_refused(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))
    literal = f"[{address}]" if ":" in address else address
    reason = refusal(f"https://{literal}/hook", settings())
    assert reason is not None and "non-public address" in reason


@pytest.mark.parametrize("address", PUBLIC)
def test_a_public_address_is_accepted(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))
    literal = f"[{address}]" if ":" in address else address
    assert refusal(f"https://{literal}/hook", settings()) is None
