"""Where the result store is, and where its credentials come from: the controller's settings, never desired/.

Harvests and checkpoints go to the local data dir (``adapters.store.LocalStore``) unless the controller names an
S3-compatible object store (``adapters.s3store.S3Store``: AWS S3, Cloudflare R2, MinIO, Backblaze, SeaweedFS):

* ``--store s3://bucket[/prefix]``, else the environment variable ``RIGSYNC_STORE`` (same form);
* the endpoint from ``RIGSYNC_STORE_ENDPOINT`` (unset: AWS's own), which passes the provider URL's rule
  (``endpoint.check_url``: https, or http to loopback only; no ``user:password@``, query or fragment);
* the region from ``RIGSYNC_STORE_REGION``, else ``AWS_DEFAULT_REGION``, else us-east-1;
* the credentials under the standard AWS names (``jobenv.STORE_CREDENTIAL_NAMES``), which boto3 reads itself;
  they are required (a store without them would fail at the first harvest, far from the cause).

Like the API URL, none of this may come from desired/: those files arrive by pull request, and a bucket or an
endpoint named there could send the fleet's results (and the requests signed with the controller's key)
anywhere. The loader refuses such keys, with why (``desired.schema_errors.STORE_WHY``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.errors import UserError
from reconciler.settings.endpoint import check_url

STORE_FLAG = "--store"
STORE_ENV = "RIGSYNC_STORE"
STORE_ENDPOINT_ENV = "RIGSYNC_STORE_ENDPOINT"
STORE_REGION_ENV = "RIGSYNC_STORE_REGION"
REGION_FALLBACK_ENV = "AWS_DEFAULT_REGION"
DEFAULT_REGION = "us-east-1"
ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"  # a variable's name, not a secret

# S3's bucket names (3-63 of lowercase letters, digits, dots and hyphens, a letter or digit at each end)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX_PART = re.compile(r"[A-Za-z0-9._=+-]{1,128}")
MAX_PREFIX_CHARS = 512
_REGION = re.compile(r"[a-z0-9-]{1,64}")


@dataclass(frozen=True)
class StoreConfig:
    """An S3-compatible result store: objects under ``<prefix>/<fleet>/`` in ``bucket`` (``prefix`` without slashes
    at either end, maybe empty), at ``endpoint`` (None: AWS's own for ``region``). No credentials here: boto3 reads
    them from the environment, so they are in no repr."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str = DEFAULT_REGION

    def where(self) -> str:
        """``s3://bucket/prefix at endpoint`` for messages (nothing secret is in any of them)."""
        at = self.endpoint or f"AWS ({self.region})"
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/") + f" at {at}"


def parse_store_url(value: str, source: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket[/prefix]``; a ``UserError`` naming ``source`` otherwise."""
    def refuse(why: str) -> UserError:
        return UserError(f"{source}: {value[:200]!r} is not a usable store: {why}")

    text = value.strip()
    if not text.startswith("s3://"):
        raise refuse("it must be s3://bucket or s3://bucket/prefix (the only store besides the local default)")
    bucket, _, prefix = text[len("s3://"):].partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise refuse("the bucket must be 3-63 lowercase letters, digits, dots or hyphens")
    prefix = prefix.strip("/")
    if len(prefix) > MAX_PREFIX_CHARS:
        raise refuse(f"the prefix is longer than {MAX_PREFIX_CHARS} characters")
    for part in prefix.split("/") if prefix else []:
        if not _PREFIX_PART.fullmatch(part) or part in (".", ".."):
            raise refuse(
                "each part of the prefix must be letters, digits, or . _ = + - (no empty part, no . or ..)"
            )
    return bucket, prefix


def store_config(flag: str | None, env: Mapping[str, str]) -> StoreConfig | None:
    """The controller's result store: ``--store`` (``flag``), else ``RIGSYNC_STORE``; None (the local store) when
    neither is set. Everything it needs is checked here, before any request: the URL, the endpoint, the region,
    and that the credentials are set (their values are never read into a message)."""
    if flag is not None:
        value, source = flag, STORE_FLAG
    elif env.get(STORE_ENV):
        value, source = env[STORE_ENV], f"the environment variable {STORE_ENV}"
    else:
        return None
    bucket, prefix = parse_store_url(value, source)
    endpoint = None
    if env.get(STORE_ENDPOINT_ENV):  # unset or empty (a workflow's undefined variable): AWS's own endpoint
        endpoint = check_url(
            env[STORE_ENDPOINT_ENV], f"the environment variable {STORE_ENDPOINT_ENV}", what="store endpoint",
            carries="the store's data and presigned URLs",
            credentials_from=f"the store's credentials come from {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}",
        )
    region_source = STORE_REGION_ENV if env.get(STORE_REGION_ENV) else REGION_FALLBACK_ENV
    region = (env.get(STORE_REGION_ENV) or env.get(REGION_FALLBACK_ENV) or DEFAULT_REGION).strip()
    if not _REGION.fullmatch(region):
        raise UserError(
            f"the environment variable {region_source}: {region[:64]!r} is not a region (lowercase letters, digits "
            "and hyphens, such as us-east-1 or auto)"
        )
    missing = [name for name in (ACCESS_KEY_ENV, SECRET_KEY_ENV) if not env.get(name)]
    if missing:
        raise UserError(
            f"{source} names an object store, but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            "not set: the store's credentials come from the controller's environment (the standard AWS names)"
        )
    return StoreConfig(bucket=bucket, prefix=prefix, endpoint=endpoint, region=region)
