"""The desired/ tree → validated, frozen ``reconciler.core.model.Desired``.

People and agents edit these YAML files by hand, so the loader's job is to refuse bad input precisely and
all at once: every problem becomes a ``LoadError`` with file, line, column, JSON pointer and message, and
nothing is acted on unless the whole tree is valid. It works from a mapping of repo-relative paths to bytes
so the git layer can feed it the tree of any commit; ``read_desired_files`` builds that mapping from disk.

One concern per module:
- ``tree``: the file tree and its limits (what a reader of disk or git may read; the git adapter imports it alone);
- ``strict_yaml``: bytes → data with line and column, refusing what YAML would hide or read two ways;
- ``schema_errors``: the JSON schemas and their errors in words a person can act on;
- ``fleet_checks``, ``sweep_checks``: what a schema cannot say (values that can never work are refused here,
  where the author is, rather than discovered by the planner on rented boxes);
- ``fields``: the field table that builds the model, each default taken from the model's dataclasses;
- ``load``: the whole tree at once, every problem reported together.
"""

from reconciler.desired.desired_tree import (
    BUDGET_FILE,
    DESIRED_DIR,
    FLEET_FILE,
    MAX_DESIRED_DEPTH,
    MAX_DESIRED_ENTRIES,
    MAX_FILE_BYTES,
    README_FILE,
    SWEEPS_DIR,
    TreeFiles,
    read_desired_files,
)
from reconciler.desired.fields import parse_duration
from reconciler.desired.load import (
    MAX_ERRORS_PER_FILE,
    MAX_RUNS_TOTAL,
    MAX_SWEEP_FILES,
    errors_of,
    load_desired,
    load_desired_from_dir,
)
from reconciler.desired.load_error import LoadError, pointer_of
from reconciler.desired.schema_errors import schema_path
from reconciler.desired.strict_yaml import parse_yaml
from reconciler.desired.sweep_checks import MAX_RUNS_PER_SWEEP

__all__ = [
    "BUDGET_FILE",
    "DESIRED_DIR",
    "FLEET_FILE",
    "MAX_DESIRED_DEPTH",
    "MAX_DESIRED_ENTRIES",
    "MAX_ERRORS_PER_FILE",
    "MAX_FILE_BYTES",
    "MAX_RUNS_PER_SWEEP",
    "MAX_RUNS_TOTAL",
    "MAX_SWEEP_FILES",
    "README_FILE",
    "SWEEPS_DIR",
    "LoadError",
    "TreeFiles",
    "errors_of",
    "load_desired",
    "load_desired_from_dir",
    "parse_duration",
    "parse_yaml",
    "pointer_of",
    "read_desired_files",
    "schema_path",
]
