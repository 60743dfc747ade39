"""The network under the client: a host's addresses resolved by the loop and raced (Happy
Eyeballs, RFC 8305, by aiohappyeyeballs, as aiohttp connects) and a failure named in fixed words."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections.abc import Sequence

import aiohappyeyeballs

from adapters.http1.errors import ConnectFailure

__all__ = ["HAPPY_EYEBALLS_DELAY", "connect_failure", "open_socket", "resolve"]

# a host's next address is tried after this long while the first still connects, so an address
# that never answers (an IPv6 route that drops packets) costs this delay, not the connect timeout
HAPPY_EYEBALLS_DELAY = 0.25

# OpenSSL's verify codes (x509_vfy.h) for the failures named apart
_EXPIRED = {9, 10}  # not yet valid, has expired
_MISMATCH = {62, 64}  # host name, IP address mismatch
_REFUSED = {errno.ECONNREFUSED}
_UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN}


async def resolve(
    loop: asyncio.AbstractEventLoop, host: str, port: int
) -> Sequence[aiohappyeyeballs.AddrInfoType]:
    """The addresses to connect to, in the resolver's order (the system's, via the loop)."""
    return await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)


async def open_socket(
    loop: asyncio.AbstractEventLoop, infos: Sequence[aiohappyeyeballs.AddrInfoType]
) -> socket.socket:
    """A connected TCP socket to one of ``infos``, raced :data:`HAPPY_EYEBALLS_DELAY` apart.
    Raises OSError when none connects."""
    if not infos:
        raise socket.gaierror(socket.EAI_NONAME, "no address")
    return await aiohappyeyeballs.start_connection(
        infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY, interleave=1, loop=loop
    )


def connect_failure(exc: OSError) -> ConnectFailure:
    """The fixed words for why connecting failed."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        if exc.verify_code in _EXPIRED:
            return ConnectFailure.CERT_EXPIRED
        if exc.verify_code in _MISMATCH:
            return ConnectFailure.HOSTNAME_MISMATCH
        return ConnectFailure.CERT_UNTRUSTED
    if isinstance(exc, ssl.SSLError):
        return ConnectFailure.TLS
    if isinstance(exc, socket.gaierror):
        return ConnectFailure.DNS
    if isinstance(exc, ConnectionRefusedError) or exc.errno in _REFUSED:
        return ConnectFailure.REFUSED
    if isinstance(exc, TimeoutError) or exc.errno == errno.ETIMEDOUT:
        return ConnectFailure.TIMED_OUT
    if exc.errno in _UNREACHABLE:
        return ConnectFailure.UNREACHABLE
    if isinstance(exc, ConnectionError):
        return ConnectFailure.CLOSED
    return ConnectFailure.UNREACHABLE
