"""Where the API key may go: the one rule (``reconciler.settings.endpoint``) and where the URL comes from.

The live commands are run in process with a repository that does not exist, so a URL that is refused must be
refused first (the message names the flag or the variable, never the repository), before anything is read or
contacted. The end-to-end proof with the real client and a logging server is
``tests/integration/test_endpoint_creds.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.errors import UserError
from reconciler.settings.endpoint import API_URL_ENV, DEFAULT_URL, check_api_url, controller_api_url

ALLOWED = [
    ("https://console.vast.ai", "https://console.vast.ai"),
    ("https://console.vast.ai/", "https://console.vast.ai"),
    ("https://vast.example.org:8443/prefix/", "https://vast.example.org:8443/prefix"),
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ("http://127.1.2.3:9/", "http://127.1.2.3:9"),
    ("http://localhost:8080", "http://localhost:8080"),
    ("http://[::1]:8080", "http://[::1]:8080"),
]

REFUSED = [
    ("http://example.com", "plain http is allowed only to a loopback host"),
    ("http://10.0.0.1:8080", "plain http is allowed only to a loopback host"),
    ("http://127.0.0.1.evil.example", "plain http is allowed only to a loopback host"),
    ("http://localhost.evil.example", "plain http is allowed only to a loopback host"),
    ("http://[::ffff:10.0.0.1]", "plain http is allowed only to a loopback host"),
    ("https://user:hunter2@console.vast.ai", "credentials (user:password@)"),
    ("http://user@127.0.0.1:8080", "credentials (user:password@)"),
    ("https://console.vast.ai/?api_key=hunter2", "a query (?...) or fragment"),
    ("https://console.vast.ai/#hunter2", "a query (?...) or fragment"),
    ("https://console.vast.ai/?", "a query (?...) or fragment"),
    ("ftp://console.vast.ai", "it must start with https://"),
    ("console.vast.ai", "it must start with https://"),
    ("127.0.0.1:8080", "it must start with https://"),
    ("", "it is empty"),
    ("https://", "it has no host"),
    ("https://console.vast.ai:99999", "it does not parse"),
    ("https://console .vast.ai", "whitespace or control characters"),
    ("https://console.vast.ai/\x00", "whitespace or control characters"),
    ("http://127.0.0.1:0", "port 0"),
]


@pytest.mark.parametrize(("url", "normal"), ALLOWED)
def test_allowed_urls_come_back_without_a_trailing_slash(url: str, normal: str) -> None:
    assert check_api_url(url, "--api-url") == normal


@pytest.mark.parametrize(("url", "why"), REFUSED)
def test_refused_urls_say_where_they_came_from_and_why(url: str, why: str) -> None:
    with pytest.raises(UserError) as info:
        check_api_url(url, "--api-url")
    message = str(info.value)
    assert message.startswith("--api-url: ") and why in message
    assert "hunter2" not in message  # the message never repeats what could be a secret


def test_the_flag_wins_over_the_environment_which_wins_over_the_default() -> None:
    env = {API_URL_ENV: "http://127.0.0.1:1234/"}
    assert controller_api_url(None, {}) == DEFAULT_URL == "https://console.vast.ai"
    assert controller_api_url(None, env) == "http://127.0.0.1:1234"
    assert controller_api_url("https://other.example", env) == "https://other.example"


def test_a_bad_environment_url_is_refused_not_ignored() -> None:
    with pytest.raises(UserError, match=f"the environment variable {API_URL_ENV}: .*plain http"):
        controller_api_url(None, {API_URL_ENV: "http://example.com"})
    with pytest.raises(UserError, match=f"the environment variable {API_URL_ENV}: .*empty"):
        controller_api_url(None, {API_URL_ENV: ""})


def test_a_bad_flag_is_refused_even_when_the_environment_is_good() -> None:
    with pytest.raises(UserError, match=r"--api-url: .*plain http"):
        controller_api_url("http://example.com", {API_URL_ENV: "http://127.0.0.1:1"})


@pytest.mark.parametrize("command", ["plan", "apply", "status", "run"])
def test_every_live_command_refuses_a_bad_flag_before_reading_anything(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(API_URL_ENV, raising=False)
    missing = tmp_path / "no-such-repo"
    code = main([command, "--repo", str(missing), "--api-url", "http://example.com:8080"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("rigsync: error: --api-url: 'http://example.com:8080' is not a usable provider URL")
    assert "no-such-repo" not in err and not missing.exists()


@pytest.mark.parametrize("command", ["plan", "apply", "status", "run"])
def test_every_live_command_refuses_a_bad_environment_url_before_reading_anything(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_URL_ENV, "https://user:hunter2@console.vast.ai")
    code = main([command, "--repo", str(tmp_path / "no-such-repo")])
    err = capsys.readouterr().err
    assert code == 1
    assert f"rigsync: error: the environment variable {API_URL_ENV}: " in err and "credentials" in err
    assert "hunter2" not in err


@pytest.mark.parametrize("proxy_var", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
def test_plain_http_is_refused_when_a_proxy_would_carry_it_off_the_machine(
    proxy_var: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.adapters.vast import VastProvider

    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(proxy_var, "http://user:hunter2@proxy.example:3128")
    with pytest.raises(UserError, match=r"in clear text: add 127\.0\.0\.1 to NO_PROXY") as info:
        VastProvider(api_key="k", server_url="http://127.0.0.1:9")
    assert "hunter2" not in str(info.value)
    VastProvider(api_key="k", server_url="https://console.vast.ai")  # a proxy only tunnels https: allowed
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert VastProvider(api_key="k", server_url="http://127.0.0.1:9/").api_url == "http://127.0.0.1:9"


def test_the_provider_checks_any_url_it_is_handed() -> None:
    from reconciler.adapters.vast import VastProvider

    with pytest.raises(UserError, match=r"the provider URL: .http://example\.com. .*plain http"):
        VastProvider(api_key="k", server_url="http://example.com")
