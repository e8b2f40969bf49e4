# shellcheck shell=bash
# Mark an attempt's run directory harvested (the controller stored its harvest): a draining box's watchdog waits
# for every run directory to be marked before it destroys the box. Argument: the attempt's directory name.
d=$RIGSYNC_ROOT/runs/$1
if [ -d "$d" ]; then : >"$d/harvested" && echo harvested; else echo "no run directory runs/$1"; fi
