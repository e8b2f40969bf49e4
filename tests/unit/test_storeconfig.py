"""Where the result store is (``--store`` / ``RIGSYNC_STORE``) and every way its settings are refused, in one line
that names the flag or variable and never a credential."""

from __future__ import annotations

import pytest

from reconciler.core.jobenv import STORE_CREDENTIAL_NAMES
from reconciler.desired.schema_errors import STORE_WHY
from reconciler.errors import UserError
from reconciler.settings import object_store as storeconfig
from reconciler.settings.endpoint import check_api_url
from reconciler.settings.object_store import StoreConfig, store_config

SECRET = "CANARYunit-" + "0d9e8f"
CREDS = {"AWS_ACCESS_KEY_ID": "AKIDUNIT", "AWS_SECRET_ACCESS_KEY": SECRET}


def refused(flag: str | None, env: dict[str, str]) -> str:
    with pytest.raises(UserError) as info:
        store_config(flag, env)
    message = str(info.value)
    assert "\n" not in message and SECRET not in message and "AKIDUNIT" not in message
    return message


def test_no_store_is_the_local_default() -> None:
    assert store_config(None, {}) is None
    assert store_config(None, {"RIGSYNC_STORE": "", **CREDS}) is None


def test_the_flag_wins_over_the_variable_and_the_defaults_apply() -> None:
    env = {"RIGSYNC_STORE": "s3://from-env/x", **CREDS}
    assert store_config("s3://from-flag/runs/2026/", env) == StoreConfig(
        bucket="from-flag", prefix="runs/2026", endpoint=None, region="us-east-1"
    )
    assert store_config(None, env) == StoreConfig(bucket="from-env", prefix="x")
    assert store_config(None, {**env, "RIGSYNC_STORE": "s3://b-only"}) == StoreConfig(bucket="b-only")


def test_endpoint_and_region_come_from_the_environment() -> None:
    env = {"RIGSYNC_STORE": "s3://bkt", "RIGSYNC_STORE_ENDPOINT": "https://acct.r2.cloudflarestorage.com/",
           "AWS_DEFAULT_REGION": "eu-west-1", **CREDS}
    got = store_config(None, env)
    assert got is not None and got.endpoint == "https://acct.r2.cloudflarestorage.com" and got.region == "eu-west-1"
    got = store_config(None, {**env, "RIGSYNC_STORE_REGION": "auto"})
    assert got is not None and got.region == "auto"
    loop = store_config(None, {**env, "RIGSYNC_STORE_ENDPOINT": "http://127.0.0.1:9000"})
    assert loop is not None and loop.endpoint == "http://127.0.0.1:9000"
    assert SECRET not in repr(loop) and SECRET not in loop.where()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("gs://bucket", "it must be s3://bucket or s3://bucket/prefix"),
        ("bucket/prefix", "it must be s3://bucket or s3://bucket/prefix"),
        ("s3://", "the bucket must be 3-63 lowercase letters"),
        ("s3://Upper", "the bucket must be 3-63 lowercase letters"),
        ("s3://ab", "the bucket must be 3-63 lowercase letters"),
        ("s3://a..b", "the bucket must be 3-63 lowercase letters"),
        ("s3://bucket/../other", "each part of the prefix"),
        ("s3://bucket/a//b", "each part of the prefix"),
        ("s3://bucket/a b", "each part of the prefix"),
        ("s3://bucket/" + "a" * 600, "the prefix is longer than 512 characters"),
    ],
)
def test_a_store_that_is_not_s3_bucket_prefix_is_refused_naming_its_source(value: str, why: str) -> None:
    assert refused(value, CREDS).startswith(f"--store: {value[:200]!r} is not a usable store: {why}")
    from_env = refused(None, {"RIGSYNC_STORE": value, **CREDS})
    assert from_env.startswith("the environment variable RIGSYNC_STORE: ") and why in from_env


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("http://s3.example.com", "plain http is allowed only to a loopback host"),
        ("ftp://127.0.0.1", "it must start with https://"),
        ("https://user:" + SECRET + "@s3.example.com", "credentials (user:password@) do not belong in it"),
        ("https://s3.example.com/?X-Amz-Signature=" + SECRET, "a query (?...) or fragment"),
        ("https://", "it has no host"),
        ("   ", "it is empty"),
    ],
)
def test_the_endpoint_passes_the_provider_urls_rule(endpoint: str, why: str) -> None:
    message = refused(None, {"RIGSYNC_STORE": "s3://bkt", "RIGSYNC_STORE_ENDPOINT": endpoint, **CREDS})
    assert message.startswith("the environment variable RIGSYNC_STORE_ENDPOINT: ") and why in message
    assert "is not a usable store endpoint" in message
    # the same rule, word for word, as the provider URL's (one function: endpoint.check_url)
    with pytest.raises(UserError) as info:
        check_api_url(endpoint, "x")
    assert why in str(info.value)


def test_store_credentials_in_the_url_point_to_the_aws_variables() -> None:
    message = refused(None, {"RIGSYNC_STORE": "s3://bkt", "RIGSYNC_STORE_ENDPOINT": "https://k:s@h", **CREDS})
    assert "come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in message


def test_a_region_that_is_not_one_is_refused_naming_the_variable() -> None:
    env = {"RIGSYNC_STORE": "s3://bkt", **CREDS}
    assert refused(None, {**env, "RIGSYNC_STORE_REGION": "us east"}).startswith(
        "the environment variable RIGSYNC_STORE_REGION: 'us east' is not a region"
    )
    assert refused(None, {**env, "AWS_DEFAULT_REGION": "EU/1"}).startswith(
        "the environment variable AWS_DEFAULT_REGION: 'EU/1' is not a region"
    )


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({}, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set"),
        ({"AWS_ACCESS_KEY_ID": "AKIDUNIT"}, "AWS_SECRET_ACCESS_KEY is not set"),
        ({"AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ACCESS_KEY_ID": ""}, "AWS_ACCESS_KEY_ID is not set"),
    ],
)
def test_missing_credentials_are_one_line_naming_them(given: dict[str, str], missing: str) -> None:
    message = refused("s3://bkt", given)
    assert message.startswith("--store names an object store, but " + missing)


def test_the_credential_names_are_the_ones_jobs_can_never_reference() -> None:
    assert {storeconfig.ACCESS_KEY_ENV, storeconfig.SECRET_KEY_ENV} <= STORE_CREDENTIAL_NAMES


def test_the_loaders_refusal_names_the_settings_as_storeconfig_spells_them() -> None:
    for name in (storeconfig.STORE_FLAG, storeconfig.STORE_ENV, storeconfig.STORE_ENDPOINT_ENV):
        assert name in STORE_WHY


def test_an_empty_endpoint_is_unset_as_a_workflow_passes_an_undefined_variable() -> None:
    got = store_config(None, {"RIGSYNC_STORE": "s3://bucket", "RIGSYNC_STORE_ENDPOINT": "", **CREDS})
    assert got is not None and got.endpoint is None
