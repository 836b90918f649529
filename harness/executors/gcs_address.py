"""A Ray GCS address as a socket address: the driver probes it before `ray.init` (which would
retry for minutes), and a trial runner probes it before leaving Ray (a private instance that
died with a killed `harness run` refuses connections)."""

from __future__ import annotations


def host_and_port(address: str) -> tuple[str, int] | None:
    """`host:port` (an IPv6 host in brackets) as (host, port); None for `auto` or another form
    Ray resolves itself."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)
