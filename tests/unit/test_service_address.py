"""Service addresses: the default port, none of Slurm's, when ADDR has none."""
from __future__ import annotations

import pytest

from slurm_snap.errors import BadValueError, ConfigError
from slurm_snap.service.address import DEFAULT_PORT, parse_address, service_address


def test_the_default_port_is_none_of_slurms_and_below_the_ephemeral_range():
    assert DEFAULT_PORT not in (6817, 6818, 6819, 6820) and DEFAULT_PORT < 32768


@pytest.mark.parametrize("text, want", [
    ("10.0.0.1", ("10.0.0.1", DEFAULT_PORT)), ("ctl", ("ctl", DEFAULT_PORT)), ("[::1]", ("::1", DEFAULT_PORT)),
    ("10.0.0.1:7000", ("10.0.0.1", 7000)), ("[fe80::1]:7001", ("fe80::1", 7001)), ("ctl:6830", ("ctl", 6830)),
])
def test_addresses_with_and_without_a_port(text, want):
    assert parse_address(text) == want


@pytest.mark.parametrize("text, why", [
    (":6830", "is not ADDR[:PORT]"), ("ctl:0", "has no TCP port"), ("ctl:65536", "has no TCP port"),
    ("ctl:x", "has no TCP port"), ("a b:1", "has no usable host"), ("[]", "has no usable host"),
    ("ctl/x", "has no usable host"),
])
def test_a_bad_address_names_the_value_and_why(text, why):
    with pytest.raises(BadValueError) as exc:
        parse_address(text, what="--listen")
    assert why in str(exc.value) and text in str(exc.value)
    with pytest.raises(ConfigError):
        parse_address(text, what="service.listen", config="/etc/x.toml")


def test_a_service_url_without_a_port_takes_the_default():
    assert service_address("slurm-snap://10.0.0.1") == ("10.0.0.1", DEFAULT_PORT)
