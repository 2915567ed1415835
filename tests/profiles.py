"""How many examples a property test tries: Hypothesis profiles, chosen once for the run.

- ``ci``: Hypothesis's full count (100 a test, and what a test asks beyond that). Chosen when
  ``CI`` is set (``true`` or ``1``), as CI services set it and ``.ci/run`` does.
- ``dev``: a tenth of that, for the fast loop and a developer's runs: every property still
  runs, from its simplest examples up, in a fraction of the time.

``HYPOTHESIS_PROFILE=ci`` (or ``dev``) overrides the choice. Neither has a deadline: no
property here is about time, and a slow example on a busy machine is not a failure.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FULL = 100  # Hypothesis's own default: the count ``examples`` is relative to

settings.register_profile(
    "ci", max_examples=FULL, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=FULL // 10, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def chosen() -> str:
    """The profile for this run: ``HYPOTHESIS_PROFILE``, else ``ci`` under CI, else ``dev``."""
    if name := os.environ.get("HYPOTHESIS_PROFILE"):
        return name
    return "ci" if os.environ.get("CI", "").lower() in ("true", "1") else "dev"


def examples(full: int) -> int:
    """A test's count: ``full`` in CI, scaled as the loaded profile is (a tenth in ``dev``),
    never below one."""
    return max(1, full * settings().max_examples // FULL)  # settings(): the loaded profile
