"""The Chat Completions ingress (``POST /v1/chat/completions``): a codec at the app edge, on the
one engine (request.py parses, encode.py encodes, http.py is the route)."""
