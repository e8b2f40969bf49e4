"""A Vast.ai emulator whose instances are real SSH hosts, for rigsync's integration tests, benchmarks and demo.

``Emulator`` serves the REST API the official ``vastai`` client speaks, a seeded offer market, a billing
ledger and fault injection; each rented instance is a real OpenSSH sshd in its own PID + mount namespace.
See README.md in this folder for the admin API.
"""

from reconciler.emulator.billing import Ledger
from reconciler.emulator.core import Emulator
from reconciler.emulator.exceptions import ApiError, EmulatorError, EmulatorUnavailable
from reconciler.emulator.market import Market

__all__ = ["ApiError", "Emulator", "EmulatorError", "EmulatorUnavailable", "Ledger", "Market"]
