# shellcheck shell=bash
# Mark the box draining ($RIGSYNC_ROOT/drain): it takes no more queue entries (enqueue.sh), the probe reports it,
# and the watchdog destroys the box once its queue is dry, nothing runs and every run directory is harvested.
mkdir -p "$RIGSYNC_ROOT" && : >"$RIGSYNC_ROOT/drain" && echo draining
