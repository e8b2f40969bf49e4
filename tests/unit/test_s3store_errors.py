"""How ``S3Store`` words the replies of an S3 service it cannot test on loopback (SlowDown, 5xx, AccessDenied...):
botocore's own Stubber hands those replies to the real client; the real server's are in the integration tier."""

from __future__ import annotations

import pytest
from botocore.stub import Stubber

from reconciler import errors
from reconciler.adapters.s3store import S3Store
from reconciler.settings.object_store import StoreConfig

SECRET = "CANARYstub-" + "51ab"
ENV = {"AWS_ACCESS_KEY_ID": "AKIDSTUB", "AWS_SECRET_ACCESS_KEY": SECRET}


@pytest.mark.parametrize(
    ("code", "status", "raised"),
    [
        ("SlowDown", 503, errors.StoreUnavailable),
        ("InternalError", 500, errors.StoreUnavailable),
        ("Whatever", 502, errors.StoreUnavailable),
        ("AccessDenied", 403, errors.StoreCredentialsRefused),
        ("InvalidAccessKeyId", 403, errors.StoreCredentialsRefused),
        ("SignatureDoesNotMatch", 403, errors.StoreCredentialsRefused),
        ("NoSuchBucket", 404, errors.StoreBucketMissing),
        ("InvalidArgument", 400, errors.StoreError),
    ],
)
def test_a_reply_becomes_our_error(code: str, status: int, raised: type[Exception]) -> None:
    store = S3Store(StoreConfig(bucket="bkt", endpoint="https://s3.example.com"), "fleet-a", env=ENV)
    with Stubber(store._client) as stub:
        stub.add_client_error("get_object", service_error_code=code, http_status_code=status)
        with pytest.raises(raised) as info:
            store.read_attempt("run-0123456789ab", 1, "stdout.log")
    message = str(info.value)
    assert "\n" not in message and SECRET not in message and "AKIDSTUB" not in message
    if raised is errors.StoreUnavailable:
        assert isinstance(info.value, errors.TransientError)
    if raised in (errors.StoreCredentialsRefused, errors.StoreBucketMissing):
        assert isinstance(info.value, errors.UserError) and "s3://bkt at https://s3.example.com" in message


def test_an_absent_object_is_none_not_an_error() -> None:
    store = S3Store(StoreConfig(bucket="bkt"), "fleet-a", env=ENV)
    with Stubber(store._client) as stub:
        stub.add_client_error("get_object", service_error_code="NoSuchKey", http_status_code=404)
        assert store.read_attempt("run-0123456789ab", 1, "stdout.log") is None


def test_no_credentials_no_store() -> None:
    with pytest.raises(errors.UserError, match="needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        S3Store(StoreConfig(bucket="bkt"), "fleet-a", env={})
    assert SECRET not in repr(S3Store(StoreConfig(bucket="bkt"), "fleet-a", env=ENV))
