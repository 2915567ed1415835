"""What a worker may claim about itself, as its token allows.

A worker announces labels and a capacity at enrollment. By default it is believed (the seed's
behaviour): its own labels, plus ``fleet=<token>`` for a fleet member — and a worker that brings
its own ``fleet`` label keeps it (the caller logs a warning). A token can narrow that, because
self-declared labels and capacity decide where work goes:

- ``pinned`` labels are the token's: every worker of the token carries them, and one that
  claims another value for a pinned key is refused;
- ``allowed_keys`` (when set) are the only keys a worker may set itself; any other is refused;
- ``max_concurrency`` caps the slots a worker gets: asking for more is granted the cap (the
  enrollment reply says so), so an impostor cannot make itself "least loaded" with 1024 slots.
  Without it the cap is :data:`DEFAULT_MAX_CONCURRENCY`; a token's own cap may be higher.

A refusal is permanent for the worker (``Rejected``): its configuration, not the network, is
wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from swamp.domain.labels import MAX_LABELS, check_label_key, check_labels, format_labels
from swamp.errors import LabelNotAllowed, LabelPinned, UserError

FLEET_LABEL = "fleet"
MAX_CAPACITY = 1024
DEFAULT_MAX_CONCURRENCY = 64  # without a token's --max-concurrency (which may go to 1024)


@dataclass(frozen=True)
class ClaimPolicy:
    pinned: Mapping[str, str] = field(default_factory=dict)
    allowed_keys: frozenset[str] | None = None  # None: a worker may set any key
    max_concurrency: int | None = None  # None: up to DEFAULT_MAX_CONCURRENCY

    @classmethod
    def build(
        cls,
        *,
        pinned: Mapping[str, str] | None = None,
        allowed_keys: Iterable[str] | None = None,
        max_concurrency: int | None = None,
    ) -> ClaimPolicy:
        """Validate what an operator asked for (flags or an admin frame)."""
        labels = check_labels(dict(pinned or {}), source="--label")
        keys = None
        if allowed_keys is not None:
            keys = frozenset(check_label_key(k, source="--allow-labels") for k in allowed_keys)
            if len(keys) > MAX_LABELS:
                raise UserError(f"--allow-labels names {len(keys)} keys (at most {MAX_LABELS})")
        if max_concurrency is not None and (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or not 1 <= max_concurrency <= MAX_CAPACITY
        ):
            raise UserError(
                f"invalid --max-concurrency {max_concurrency!r}: expected 1-{MAX_CAPACITY}"
            )
        return cls(labels, keys, max_concurrency)

    @classmethod
    def from_attributes(cls, attrs: Mapping) -> ClaimPolicy:
        keys = attrs.get("allowedLabelKeys")
        return cls(
            dict(attrs.get("pinnedLabels") or {}),
            frozenset(keys) if keys is not None else None,
            attrs.get("maxConcurrency"),
        )

    def to_attributes(self) -> dict:
        out: dict = {}
        if self.pinned:
            out["pinnedLabels"] = dict(sorted(self.pinned.items()))
        if self.allowed_keys is not None:
            out["allowedLabelKeys"] = sorted(self.allowed_keys)
        if self.max_concurrency is not None:
            out["maxConcurrency"] = self.max_concurrency
        return out

    def describe(self) -> str:
        parts = []
        if self.pinned:
            parts.append(f"labels {format_labels(dict(self.pinned))} pinned")
        if self.allowed_keys is not None:
            parts.append("workers may set " + (", ".join(sorted(self.allowed_keys)) or "no labels"))
        if self.max_concurrency is not None:
            parts.append(f"at most {self.max_concurrency} slot(s) a worker")
        return "; ".join(parts)


@dataclass(frozen=True)
class Granted:
    """What the worker is admitted as."""

    labels: dict[str, str]
    capacity: int
    kept_own_fleet: bool  # it brought its own fleet label (the caller warns)
    capacity_capped: bool  # it asked for more slots than the token allows


def grant(
    policy: ClaimPolicy, *, token_name: str, fleet: bool, labels: Mapping[str, str], capacity: int
) -> Granted:
    """Decide the labels and capacity of an enrolling worker, or refuse it."""
    for key, value in labels.items():
        if key in policy.pinned and policy.pinned[key] != value:
            raise LabelPinned(
                f"token {token_name!r} pins the label {key}={policy.pinned[key]}; "
                f"this worker claims {key}={value}: remove it from --label / "
                "SWAMP_WORKER_LABELS"
            )
    if policy.allowed_keys is not None:
        stray = sorted(
            k
            for k in labels
            if k not in policy.allowed_keys
            and not (k in policy.pinned and labels[k] == policy.pinned[k])
        )
        if stray:
            allowed = ", ".join(sorted(policy.allowed_keys)) or "none"
            raise LabelNotAllowed(
                f"token {token_name!r} does not let its workers set the label "
                f"{stray[0]!r} (keys they may set: {allowed}); remove it from "
                "--label / SWAMP_WORKER_LABELS"
            )
    merged = {**labels, **policy.pinned}
    kept_own_fleet = False
    if fleet:
        if FLEET_LABEL in merged:
            kept_own_fleet = FLEET_LABEL not in policy.pinned and merged[FLEET_LABEL] != token_name
        else:
            merged[FLEET_LABEL] = token_name
    if len(merged) > MAX_LABELS:
        raise LabelNotAllowed(f"a worker may carry at most {MAX_LABELS} labels")
    cap = policy.max_concurrency or DEFAULT_MAX_CONCURRENCY
    return Granted(merged, min(capacity, cap), kept_own_fleet, capacity > cap)
