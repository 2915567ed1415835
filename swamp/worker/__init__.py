"""The worker agent: config → identity → connect loop → session (enroll, heartbeat, dispatches)."""
