"""How hard the property tests try: hypothesis profiles, and each test's example count scaled by the profile.

``fast`` (the default) runs a fifth of every count, so the unit tier stays a quick loop; ``ci`` (the README's
test command passes ``--hypothesis-profile ci``) runs the counts the tests name. A test that names its own count
writes ``max_examples=examples(N)``: N under ``ci``. Neither profile times an example: a slow draw or a slow example
on a loaded machine is not a failure.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

FULL = 100  # hypothesis's own default count: the ``ci`` profile's, against which a named count is scaled


# What a loaded machine must not turn red: a draw slower than hypothesis expects (too_slow, too_large data is still
# reported) and an example past a wall-clock deadline. The counts are the profile's; time is not a property here.
UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


def register() -> None:
    settings.register_profile("ci", max_examples=FULL, **UNTIMED)
    settings.register_profile("fast", max_examples=FULL // 5, **UNTIMED)


def examples(n: int) -> int:
    """``n`` under the ``ci`` profile, scaled down with the loaded profile's count (at least 10)."""
    return max(10, n * settings.default.max_examples // FULL)
