"""Service addresses: "ADDR:PORT" (IPv4, a host name, or [IPv6])."""
from __future__ import annotations

from ..errors import BadValueError, ConfigError

SCHEME = "slurm-snap://"


def parse_address(text: str, *, what: str = "service address", config: str | None = None) -> tuple[str, int]:
    def bad(why: str):
        if config is not None:
            return ConfigError(path=config, key=what, why=f"{text!r} {why}")
        return BadValueError(what=what, value=text, why=why)

    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise bad("is not ADDR:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() or c in "/@?#" or not c.isprintable() for c in host):
        raise bad("has no usable host")
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise bad("has no TCP port (1-65535)")
    return host, int(port)


def service_address(url: str) -> tuple[str, int]:
    """(host, port) of a slurm-snap:// inventory URL."""
    if not url.startswith(SCHEME):
        raise BadValueError(what="service URL", value=url, why=f"does not start with {SCHEME}")
    return parse_address(url[len(SCHEME):], what="inventory.url")
