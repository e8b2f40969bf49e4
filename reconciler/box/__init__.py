"""What runs ON a rented box: rigsync's side of the run protocol there, standard library only (Python >= 3.8).

Nothing here is imported by the box as a package: the controller (``reconciler.remote``) ships these files over
SSH as text. The shell scripts run as ``lib.sh`` (the shared functions; ``proc.sh`` too for kill, launch and the
wrapper) followed by the script; the Python
programs (``probe.py``, ``watchdog.py``, ``harvest.py``) travel as one bundle each, the program plus the modules of
this package it imports (``boxlib.py``, the shared helpers and the one rule of box activity), registered under their
own names so ``from reconciler.box.boxlib import ...`` works on a box that has only ``python3``. An import contract
(pyproject.toml) and a unit test keep every module here to the standard library and Python 3.8 syntax.

The programs: the probe (``probe.py`` run by ``probe.sh``: one JSON document describing the box, read and reported
under the bounds of ``limits.py``), launch (``launch.sh``, which installs and starts ``wrapper.sh`` and prints its
pid and start tick; ``enqueue.sh`` queues it instead, ``dequeue.sh`` starts a queued one), kill (``kill.sh``: it
signals only the process group the launch recorded, never a pid read from a run directory; without that identity it
records the end and the wrapper ends its own command), bootstrap (``bootstrap.sh``, which installs and starts
``bootstrap_run.sh``), ship-code (``ship_code.sh``), the harvest (``harvest.py`` run by ``harvest.sh``: a capped tar
stream of an attempt's results on stdout), ``stage_resume.sh`` (a checkpoint tar from stdin into ``resume/``),
``read_log.sh`` (a slice of an attempt's log) and the watchdog. With a result store that boxes reach themselves
(issue 22), the box moves its data with presigned URLs that arrive on a command's stdin, never its argv:
``upload.sh`` runs the harvest into a file under ``tmp/`` (``harvest.py --out``) and uploads it, and the run files
the controller reads on their own, with ``transfer.py put``; ``fetch_resume.sh`` downloads a checkpoint with
``transfer.py get``, checked against the size and SHA-256 the controller recorded, and hands it to
``stage_resume.sh``.

Box activity (``boxlib.py``): the probe (``probe.py``) and the watchdog (``watchdog.py``) both ask "is anything
alive on this box, and when did anything last happen?". The answer is ``boxlib.box_activity``, there once: the probe
reports it (``last_activity_at``) and the controller's idle rule reads that value, while the watchdog feeds the same
answer to its ``decide``. So the controller and the box agree about when a box went quiet; they differ only in who
acts (a live controller retires its idle boxes itself, the watchdog waits ``CONTROLLER_GRACE_S`` past its last
probe). ``boxlib.py`` travels with each program that imports it (the bundle registers it as
``reconciler.box.boxlib``): standard library only, Python 3.8 syntax, no side effects at import. Its docstring and
the watchdog's are short on purpose: both travel in the instance's onstart, which Vast caps at 10,000 characters.

The queue (``enqueue.sh``, ``dequeue.sh``, ``queue.sh``): a launch marked queued does not start its attempt; it
writes an entry under ``queue/<slot>/`` (the slot is the GPU mask, ``0`` or ``0_1``), holding launch.sh's arguments,
the epoch, and the job's environment records in a 0600 file the dequeue deletes the moment the launch opened it
(the box is the stranger's anyway: whoever controls it can read what runs there). When an attempt ends, its wrapper
runs its slot's dequeue, which starts the next entry through ``launch.sh`` itself; the probe runs the dequeue of
every slot with entries each cycle (the backstop for a wrapper killed -9), and the enqueue runs it at once (a slot
that freed between two cycles never waits). A kill of a queued attempt tombstones it (the dequeue then skips it)
and removes its entry.

The fence (``epoch``): the highest lease epoch the box was shown. The probe, a launch and an enqueue raise it
(under flock on ``epoch.lock``); a launch or an enqueue with an older epoch is refused (``FENCED_EXIT``), and a
queued entry older than the fence is tombstoned ``fenced: epoch A < B`` when its turn comes. Epoch 0 (no lease)
never refuses and never lowers it.

The drain (``drain.sh``): a draining box takes no more queue entries (``DRAINING_EXIT``); once its queue is dry,
nothing is alive and every run directory holds the ``harvested`` mark (``harvested.sh``, sent by the controller
after it stored a harvest), its watchdog destroys it at once (verdict ``drained``).

The watchdog is the box's own kill switch. At rent, the instance's onstart writes ``watchdog.py`` and its supervisor
``watchdog_run.sh`` under ``watchdog/`` (``watchdog_start.sh``) at every boot and starts them detached, so they
outlive any SSH session and the controller itself. The watchdog destroys its own instance --
``DELETE /api/v0/instances/$CONTAINER_ID/`` with ``CONTAINER_API_KEY``, the per-instance key the provider sets in
every container (never the account key), at ``RIGSYNC_API_URL``, which the Provider adapter sets in the instance's
environment from its own configured URL (never a value from desired/) -- and never stops it. It destroys the box
(``watchdog.decide``, a pure function; the state is read afresh at every check):

* ``ttl``: up for the fleet's ``ttl``, counted from the watchdog's first start on this disk, busy or not (a hung
  run ends here);
* ``orphan``: no controller for ``orphan_timeout``: the probe refreshes ``watchdog/touched`` every cycle (before
  the first probe the box's start counts);
* ``drained``: marked draining, queue empty, nothing alive, every run directory harvested (see the drain above);
* ``idle``: no run or bootstrap alive, no queue entry, nothing run-related for ``idle_timeout``
  (``boxlib.box_activity``: a run directory created, started, heartbeat, ended; a bootstrap finished), counted from
  the latest of that, the box's start and the last probe, and no controller for at least ``CONTROLLER_GRACE_S`` (60
  s). While a controller probes, idle boxes are its call (it keeps ``min_instances``, bootstraps before the first
  launch, harvests before it destroys, and judges idleness by the same ``box_activity``, which the probe reports as
  ``last_activity_at``); once it is gone, a box retires itself ``idle_timeout`` after its last run ends.

The API call is retried (1 s doubling to 60 s) until the box is gone; the watchdog logs to ``watchdog/watchdog.log``
and never writes the key. The limits are the fleet's at rent time. Like the probe it needs ``python3``; without
one ``watchdog_start.sh`` logs that the box has no watchdog.

Layout under ``$HOME/rigsync/``::

    code/<commit>/                       unpacked tree of a pinned commit (atomic rename into place)
    bootstrap/<hash>.sh|.run.sh|.log|.ok|.failed|.pid|.lock/
    bootstrap/<hash>.uploaded|.reported  the bootstrap cache the runner uploaded ("SIZE SHA256"), until bootstrap.sh
                                         reported it once (then .ok); .cache.tar while packing or restoring
    bootstrap/transfer.py                what a bootstrap with a cache restores and uploads with
    runs/<run_id>.<attempt>/             meta.json, slot, wrapper.sh, pid, started_at, heartbeat, stdout.log,
                                         stderr.log, exit_code, ended_at, killed_reason, metrics file,
                                         resume/ (the checkpoint it resumed from, if any), launched (launch's
                                         answer, when the dequeue started it), tombstone, harvested
    queue/<slot>/<seq>-<run_id>.<attempt>/  argv, epoch, env (0600, gone once the launch opened it)
    queue/<slot>.lock, <slot>.seq        the slot's lock (flock) and its entry counter
    bin/launch.sh, bin/dequeue.sh        what the box starts a queued attempt with (installed by each enqueue)
    epoch, epoch.lock, drain             the fence, its lock, the drain marker
    resume/<run_id>.<attempt>/           a checkpoint staged for an attempt about to launch (stage_resume.sh)
    tmp/upload.*/, tmp/fetch.*/          a transfer's temporary files (removed when it ends)
    watchdog/                            watchdog.py, run.sh, pid, started_at, touched, watchdog.log

The probe needs ``python3`` on the box (every Vast image has one); without it the probe prints a JSON document
with only ``error`` and ``box_now``, which the controller's parser reports as a failed probe.

A run's metrics file is resolved relative to its run directory (absolute paths are taken as they are); the
wrapper exports ``RIGSYNC_METRICS_FILE`` with the resolved path, because the command's working directory is the
shared code tree and a relative write there would mix runs.
"""
