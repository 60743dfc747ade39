"""Where the Redis is (``state.redis_mode`` and its fields), free of redis-py so that reading the
settings costs nothing when no Redis is configured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gateway.kernel.settings import StateSettings

Mode = Literal["standalone", "cluster", "sentinel"]


@dataclass(frozen=True, slots=True)
class Topology:
    """The URL gives credentials, db and TLS; in cluster mode its host is the seed node, in
    sentinel mode it is not used (the sentinels name the master)."""

    url: str
    mode: Mode = "standalone"
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_master: str = ""
    sentinel_password: str | None = field(default=None, repr=False)

    @property
    def lean(self) -> bool:
        """The lean client (``state/redis_lean.py``) can talk to it: standalone, without TLS."""
        return self.mode == "standalone" and not self.url.startswith("rediss://")

    @classmethod
    def from_settings(cls, settings: StateSettings) -> Topology:
        assert settings.redis_url is not None
        password = settings.sentinel_password
        return cls(
            url=settings.redis_url.get_secret_value(),
            mode=settings.redis_mode,
            sentinels=tuple(_host_port(s) for s in settings.sentinels),
            sentinel_master=settings.sentinel_master or "",
            sentinel_password=password.get_secret_value() if password is not None else None,
        )


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")  # validated by StateSettings
    return host.strip("[]"), int(port)
