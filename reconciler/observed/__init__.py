"""observed/: what rigsync saw and did, as committed files. Persistence here, presentation kept apart.

* ``attempts``: which box each attempt of a run ran on, and which run a person means (``rigsync logs``/``ssh``).
* ``codec``: the one YAML style of observed/ (dump/load), UTC times, the file paths.
* ``documents``: the ``observed/*.yaml`` documents rendered from one cycle's facts.
* ``memory``: the cross-cycle ``FleetMemory`` to and from those files (what a restart rebuilds from them).
* ``summary``: the one-line commit message saying what changed.
* ``tree``: observed/ in a checkout's working tree: reading the files, and the one writer of files and
  run-archive lines (the git adapter commits what it wrote).

The package ``__init__`` imports nothing, so the git adapter can use ``tree`` without the renderer.
"""
