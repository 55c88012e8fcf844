"""Service addresses: "ADDR[:PORT]" (IPv4, a host name, or [IPv6]).

The port may be left out: DEFAULT_PORT. It is none of Slurm's own
(slurmctld 6817, slurmd 6818, slurmdbd 6819, slurmrestd's usual 6820),
since the service runs on the controller beside them, and it is below
Linux's ephemeral range (32768-60999), so an outgoing connection never
holds it when the service starts. `doctor` checks the configured port
against the running slurm.conf (doctor/security_checks.py).
"""
from __future__ import annotations

from ..errors import BadValueError, ConfigError

SCHEME = "slurm-snap://"
DEFAULT_PORT = 6830


def parse_address(text: str, *, what: str = "service address", config: str | None = None) -> tuple[str, int]:
    def bad(why: str):
        if config is not None:
            return ConfigError(path=config, key=what, why=f"{text!r} {why}")
        return BadValueError(what=what, value=text, why=why)

    if text.startswith("[") and text.endswith("]") or ":" not in text:
        host, port = text, str(DEFAULT_PORT)      # "[::1]", "ctl", "10.0.0.1": the default port
    else:
        host, _sep, port = text.rpartition(":")
        if not host:
            raise bad("is not ADDR[:PORT]")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() or c in "/@?#[]" or not c.isprintable() for c in host):
        raise bad("has no usable host")
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise bad("has no TCP port (1-65535)")
    return host, int(port)


def service_address(url: str) -> tuple[str, int]:
    """(host, port) of a slurm-snap:// inventory URL."""
    if not url.startswith(SCHEME):
        raise BadValueError(what="service URL", value=url, why=f"does not start with {SCHEME}")
    return parse_address(url[len(SCHEME):], what="inventory.url")
