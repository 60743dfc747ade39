"""The tenancy limits' counters: the seam and semantics (``base``), in process (``memory``), in Redis
(``redis``)."""
