"""``rigsync review``: what a change to desired/ means, for the person reviewing its pull request.

First, every secret reference the change adds or changes (a sweep's ``env: {T: ${NAME}}``: the controller's value of
NAME goes to rented boxes), marked NOT ALLOWED when ``RIGSYNC_JOB_SECRETS`` is set where review runs and does not
list the name. Then runs added, removed and changed per sweep (by content id, against ``--base``), the price and
time of the added work checked against the budget left, and the validation errors of the head: from committed files
alone, so it runs in CI without a single credential. Exit 1 when the head's desired/ is invalid (the errors are
still printed, as data); ``--markdown`` is one pull-request comment, bounded to fit GitHub's limit.
"""

from __future__ import annotations

import argparse
import json
import os

from reconciler.cli._common import REVIEW_HEAD, add_checkout_arg
from reconciler.cli._review_git import review
from reconciler.core.jobenv import JOB_SECRETS_ENV, allowlist_given
from reconciler.errors import UserError
from reconciler.plan import review as reviewing


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Compare desired/ at --head with --base from committed files alone: first every secret reference the "
        f"change adds or changes (marked when {JOB_SECRETS_ENV} is set here and does not list it), then runs per "
        "sweep by content id, the price and time of the added work against the budget left (observed/ at the "
        "base), and the head's validation errors. Exit 1 when the head is invalid."
    )
    add_checkout_arg(p)
    p.add_argument("--base", required=True, help="the revision the change is compared with (e.g. origin/main)")
    p.add_argument("--head", default=REVIEW_HEAD, help="the revision under review (default: %(default)s)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON document (schemas/review.schema.json)")
    fmt.add_argument(
        "--markdown", action="store_true",
        help="print one pull-request comment (bounded under GitHub's 65,536 characters; values made safe)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.repo.is_dir():
        raise UserError(f"{args.repo}: not a directory")
    doc = review(args.repo, args.base, args.head, allowed_secrets=allowlist_given(os.environ))
    if args.json:
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    elif args.markdown:
        print(reviewing.markdown(doc), end="")
    else:
        print(reviewing.text(doc))
    return 0 if doc["valid"] else 1
