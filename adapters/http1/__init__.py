"""A lean HTTP/1.1 keep-alive client for upstream calls: asyncio transports, the ``httptools``
response parser (the C parser uvicorn uses), a LIFO pool of idle connections, optional forward
proxies. Laid out as httpcore is: :mod:`~adapters.http1.pool` (the pool, the request head, getting a
connection), :mod:`~adapters.http1.connection` (one connection, its idle-socket check),
:mod:`~adapters.http1.exchange`
(one response's state, its limits and the bounded decoder), :mod:`~adapters.http1.proxy` (which
proxy, the CONNECT tunnel), :mod:`~adapters.http1.network` (DNS, Happy Eyeballs, a failure's
name) and :mod:`~adapters.http1.errors`.

Only what the gateway needs: POST/GET with a whole body, responses framed by Content-Length,
chunked or the connection's close, gzip/deflate decoding. :mod:`adapters.transport` is the
gateway-facing layer (errors, logging, SSE); nothing else imports this package.

Error messages here are fixed words: no URL, key or body ever reaches one.
"""

from adapters.http1.errors import (
    ConnectError,
    ConnectFailure,
    ConnectionLost,
    HTTPClientError,
    ProtocolError,
    ReadTimeout,
    RequestNotSent,
    ResponseTooLarge,
)
from adapters.http1.exchange import HIGH_WATER, MAX_HEAD_BYTES, MAX_HEADER_LINE, MAX_HEADERS, Response
from adapters.http1.network import HAPPY_EYEBALLS_DELAY
from adapters.http1.pool import IDLE_SECONDS, Pool

__all__ = [
    "HAPPY_EYEBALLS_DELAY",
    "HIGH_WATER",
    "IDLE_SECONDS",
    "MAX_HEADERS",
    "MAX_HEADER_LINE",
    "MAX_HEAD_BYTES",
    "ConnectError",
    "ConnectFailure",
    "ConnectionLost",
    "HTTPClientError",
    "Pool",
    "ProtocolError",
    "ReadTimeout",
    "RequestNotSent",
    "Response",
    "ResponseTooLarge",
]
