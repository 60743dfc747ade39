"""The upstream client's failures. Every message is fixed words: no URL, key, header value or body
ever reaches one, so :mod:`adapters.transport` may pass them on to a client and a log line."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ConnectError",
    "ConnectFailure",
    "ConnectionLost",
    "HTTPClientError",
    "ProtocolError",
    "ReadTimeout",
    "RequestNotSent",
    "ResponseTooLarge",
]


class HTTPClientError(Exception):
    """A failure of an upstream call; the message is fixed (never a URL or a body)."""


class ConnectFailure(StrEnum):
    """Why no connection was made, in the words a client and a log line get."""

    REFUSED = "the connection was refused"
    TIMED_OUT = "the connection timed out"
    DNS = "the DNS lookup failed"
    UNREACHABLE = "the network is unreachable"
    CLOSED = "the server closed the connection while it was being made"
    CERT_UNTRUSTED = "the TLS certificate is not trusted"
    HOSTNAME_MISMATCH = "the TLS certificate does not match the host name"
    CERT_EXPIRED = "the TLS certificate has expired"
    TLS = "the TLS handshake failed"
    PROXY_AUTH = "the forward proxy refused the tunnel (407, proxy authentication required)"
    PROXY_REFUSED = "the forward proxy refused the tunnel"
    PROXY_CLOSED = "the forward proxy closed the connection"
    PROXY_MALFORMED = "the forward proxy sent a malformed answer"
    POOL_FULL = "no connection was free within the connect timeout"
    CLIENT_CLOSED = "the upstream client is closed"


class ConnectError(HTTPClientError):
    """No connection; ``reason`` says why."""

    def __init__(self, reason: ConnectFailure) -> None:
        super().__init__(f"The gateway could not connect to the upstream server: {reason}.")
        self.reason = reason


class ReadTimeout(HTTPClientError):
    """Nothing came from the server for the read timeout while a reader waited."""


class ConnectionLost(HTTPClientError):
    """The server closed or reset the connection before the response ended (the request may
    have been processed: it is never sent again here; retrying is the route's policy)."""


class ProtocolError(HTTPClientError):
    """The server's bytes were not a valid HTTP/1.1 response."""


class ResponseTooLarge(ProtocolError):
    """The response's head passed a limit (line length, header count, head bytes) or its decoded
    body passed the body limit; the connection is closed at once."""


class RequestNotSent(HTTPClientError):
    """The request cannot be sent as given (a URL scheme other than http/https, a header name
    that is not a token, a value with a control byte or outside ASCII, a framing header the
    client writes itself); nothing was sent."""
