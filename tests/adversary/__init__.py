"""The adversary corpus's tools: hostile jobs, hostile boxes, and the checks of what a controller let through.

Issue 20: a rented box is a stranger's machine. The integration tests ``tests/integration/test_adversary*.py``
make the emulator's real sshd boxes hostile from outside (writing into a box's root and bin directories, which
the test can reach on the host) and through the sweep's own command (``jobs.JOB``, shipped with the fleet's code),
then check that the controller, ``rigsync run`` as a real process, kept cycling, settled every attempt once, and
let nothing unchecked into git, its data dir or its memory (``checks``).
"""
