"""What every test shares."""

from hypothesis import HealthCheck, settings

# No property test here is about time, and the suite runs two at a time beside real
# orchestrators and workers: a slow example on a busy machine is not a failure.
settings.register_profile("swamp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("swamp")
