"""The one outbound rule (finetune_studio/outbound.py): which targets the server may reach."""

from __future__ import annotations

import pytest

from finetune_studio.config import Settings
from finetune_studio.outbound import address_problem, name_problem

SETTING = "FINETUNE_STUDIO_WEBHOOK_ALLOWED_HOSTS"


def names(url: str, allowed: list[str], exposed: bool = True) -> str | None:
    return name_problem(url, allowed=allowed, exposed=exposed, what="a webhook", setting=SETTING)


def addresses(host: str, address: str, allowed: list[str]) -> str | None:
    return address_problem(host, address, allowed=allowed, exposed=True, setting=SETTING)


def test_a_loopback_server_reaches_anything_and_an_exposed_one_only_what_is_listed() -> None:
    assert names("http://127.0.0.1:9/x", [], exposed=False) is None
    assert address_problem("h", "127.0.0.1", allowed=[], exposed=False, setting=SETTING) is None
    assert "not a host this server lets a webhook reach" in str(names("https://hooks.example/x", []))
    assert names("https://hooks.example/x", ["hooks.example"]) is None
    assert names("http://10.1.2.3/x", ["10.0.0.0/8"]) is None
    assert names("http://[::1]:80/x", ["::1"]) is None
    for bad in ("ftp://hooks.example/", "http:///x", "http://u:p@hooks.example/", "http://hooks.example:port/"):
        assert names(bad, ["hooks.example"]) is not None, bad


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.5", "192.168.1.1", "172.16.0.1", "169.254.169.254", "::1",
                                     "fe80::1", "fd00::1", "0.0.0.0", "::ffff:127.0.0.1", "100.64.0.1"])
def test_a_listed_name_that_resolves_to_a_special_address_is_refused(address: str) -> None:
    assert "resolves to" in str(addresses("hooks.example", address, ["hooks.example"]))


def test_a_special_address_passes_when_it_or_its_network_is_listed() -> None:
    assert addresses("hooks.lan", "10.0.0.5", ["hooks.lan", "10.0.0.0/8"]) is None
    assert addresses("hooks.lan", "10.0.0.5", ["hooks.lan", "10.0.0.5"]) is None
    assert addresses("hooks.example", "93.184.215.14", ["hooks.example"]) is None


def test_the_setting_takes_names_addresses_and_networks_and_says_what_is_wrong() -> None:
    settings = Settings(webhook_allowed_hosts="Hooks.Example, 10.0.0.0/8 ,[fd00::1]")
    assert settings.webhook_allowed_hosts == ["hooks.example", "10.0.0.0/8", "fd00::1"]
    with pytest.raises(ValueError, match="without a scheme, port or path"):
        Settings(webhook_allowed_hosts="https://hooks.example")
    with pytest.raises(ValueError, match="a wait cannot be negative"):
        Settings(webhook_retry_seconds="5,-1")
