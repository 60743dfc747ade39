"""The HTTP server under the app: uvicorn's ``Server`` with the gateway's shutdown drain
(``server``), its HTTP/1.1 protocol with read bounds (``server_protocol``), the supervisor of
``serve --workers`` (``supervisor``), and ``internals``: all the gateway knows of uvicorn's and
websockets' internals, the one module of this package the API layer imports."""
