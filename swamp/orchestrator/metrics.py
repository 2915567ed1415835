"""Supply and demand for autoscalers: ``GET /metrics`` in the Prometheus text format.

Gauges are read from the live pool and queue when scraped (a custom collector: nothing is kept
up to date between scrapes); counters and the queue-wait histogram are updated as things happen.
Produced with ``prometheus_client`` into a registry of this orchestrator's own, never the
process-global one.

Supply: workers by status and fleet, slots total and busy by fleet. Demand, by requirement (the
label set a step asks for): steps waiting, steps running, the idle slots of the workers that
match it, and the oldest wait — what an autoscaler needs (docs/autoscaling.md); which
requirements have series, and how many at most, is :mod:`swamp.domain.demand`'s. History:
dispatches by outcome, enrollment rejections by reason, queue timeouts, and how long steps
waited.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from swamp.domain.demand import IDLE, MAX_SERIES, RECENT_SECONDS, Demand, Series
from swamp.domain.workers import WorkerStatus, is_schedulable

if TYPE_CHECKING:
    from swamp.orchestrator.pool import Member, Pool
    from swamp.orchestrator.queue import DispatchQueue

CONTENT_TYPE = CONTENT_TYPE_LATEST
WAIT_BUCKETS = (0.005, 0.05, 0.5, 1, 5, 15, 60, 300, 900, 3600, float("inf"))


def fleet_of(member: Member) -> str:
    """The fleet its token puts it in: the ``fleet`` label the token pins, else the token's
    name (a single worker is a fleet of one) — never what a worker claims: a ``fleet`` label a
    worker brings itself must not move its slots into another fleet's numbers, which an
    autoscaler reads."""
    return member.fleet or member.token_name


class _Live:
    """The gauges, computed from the pool and the queue at scrape time."""

    def __init__(
        self, pool: Pool, queue: DispatchQueue, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.pool = pool
        self.queue = queue
        self.clock = clock
        self.series = Series()  # which requirements have series, scrape after scrape

    def describe(self) -> list[Metric]:
        return []  # no registration-time collect (the pool may not exist yet)

    def collect(self) -> Iterator[Metric]:
        workers = GaugeMetricFamily(
            "swamp_workers", "Workers in the pool by status and fleet", labels=["status", "fleet"]
        )
        slots = GaugeMetricFamily(
            "swamp_slots",
            "Dispatch slots of connected, schedulable workers by fleet (not draining ones)",
            labels=["fleet"],
        )
        busy = GaugeMetricFamily(
            "swamp_slots_busy", "Slots running a dispatch, by fleet", labels=["fleet"]
        )
        by_status: Tally = Tally()
        total: Tally = Tally()
        used: Tally = Tally()
        for member in list(self.pool.members.values()):
            fleet = fleet_of(member)
            status = member.status if member.connected else WorkerStatus.DISCONNECTED.value
            by_status[(status, fleet)] += 1
            if member.connected and is_schedulable(member.status):  # draining: not supply
                total[fleet] += member.capacity
                used[fleet] += len(member.active)
        for (status, fleet), count in sorted(by_status.items()):
            workers.add_metric([status, fleet], count)
        for fleet in sorted(total):
            slots.add_metric([fleet], total[fleet])
            busy.add_metric([fleet], used[fleet])
        yield workers
        yield slots
        yield busy

        yield from self._demand()
        by_priority = GaugeMetricFamily(
            "swamp_queue_waiting_by_priority",
            "Steps waiting for a worker, by the priority they were given (one series per "
            "priority present: at most 201, -100 to 100)",
            labels=["priority"],
        )
        for priority, count in sorted(self.queue.waiting.by_priority.items()):
            by_priority.add_metric([str(priority)], count)
        yield by_priority

    def _demand(self) -> Iterator[Metric]:
        """Per requirement: steps waiting and running, idle matching slots, the oldest wait."""
        demand = self.queue.demand()
        chosen = self.series.select(demand, self.clock())
        idle = self.pool.index.idle_slots(chosen)
        rows: dict[str, tuple[Demand, int]] = {}
        for requirement in chosen:
            text = requirement.text()
            mine, slots = demand.get(requirement, IDLE), idle[requirement]
            if text in rows:  # two requirements one name (a label called "target"): one series
                theirs, more = rows[text]
                mine = Demand(
                    theirs.waiting + mine.waiting,
                    theirs.running + mine.running,
                    max(theirs.oldest_wait, mine.oldest_wait),
                )
                slots = max(slots, more)
            rows[text] = (mine, slots)
        kept = f"{RECENT_SECONDS / 60:.0f} minutes"
        scope = (
            f"Series: each requirement with a step waiting or running, and at 0 for {kept} "
            f"after a scrape last saw one; at most {MAX_SERIES} requirements"
        )
        waiting = GaugeMetricFamily(
            "swamp_queue_waiting",
            "Steps waiting for a worker, by requirement (the labels, platform or target a step "
            f"asks for, as 'swamp worker queue' names it). {scope}",
            labels=["requirement"],
        )
        running = GaugeMetricFamily(
            "swamp_queue_running",
            "Steps running on a worker (each holds a slot, draining workers' too), by the "
            f"requirement they were placed with. {scope}",
            labels=["requirement"],
        )
        idle_slots = GaugeMetricFamily(
            "swamp_queue_idle_slots",
            "Free slots of connected, schedulable workers (not draining) that match the "
            "requirement. A worker may match several requirements and counts in each: do not "
            f"add these up across requirements. {scope}",
            labels=["requirement"],
        )
        oldest = GaugeMetricFamily(
            "swamp_queue_oldest_wait_seconds",
            "How long the oldest waiting step of each requirement has waited (0: none waits). "
            f"{scope}",
            labels=["requirement"],
        )
        for text, (row, slots) in sorted(rows.items()):
            waiting.add_metric([text], row.waiting)
            running.add_metric([text], row.running)
            idle_slots.add_metric([text], slots)
            oldest.add_metric([text], round(row.oldest_wait, 3))
        omitted = GaugeMetricFamily(
            "swamp_queue_requirements_omitted",
            f"Requirements with steps waiting or running left without series (past {MAX_SERIES}: "
            "those with the least demand)",
        )
        omitted.add_metric([], self.series.omitted)
        yield from (waiting, running, idle_slots, oldest, omitted)


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # the *_created samples mean nothing to an autoscaler
        self.registry = CollectorRegistry(auto_describe=False)
        self.dispatches = Counter(
            "swamp_dispatches",
            "Placed steps by outcome (succeeded, failed, or the error code that ended them)",
            ["outcome"],
            registry=self.registry,
        )
        self._by_outcome: dict[str, Counter] = {}  # outcomes are a few words and error codes
        self.rejections = Counter(
            "swamp_enrollment_rejections",
            "Enrollments refused, by reason (the error code)",
            ["reason"],
            registry=self.registry,
        )
        self.queue_timeouts = Counter(
            "swamp_queue_timeouts",
            "Steps that waited their whole queue timeout",
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "swamp_queue_wait_seconds",
            "How long steps that had to wait waited for a worker",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )

    def watch(
        self, pool: Pool, queue: DispatchQueue, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.registry.register(_Live(pool, queue, clock=clock))

    # -- what the shells report ------------------------------------------------------------

    def on_dispatch(self, what: str, outcome: str) -> None:
        counter = self._by_outcome.get(outcome)
        if counter is None:  # a labelled child once per outcome, not a lookup per dispatch
            counter = self._by_outcome[outcome] = self.dispatches.labels(outcome=outcome)
        counter.inc()

    def on_queue(self, what: str, value: float) -> None:
        if what == "waited":
            self.queue_wait.observe(value)
        elif what == "timed_out":
            self.queue_timeouts.inc()

    def on_rejection(self, reason: str) -> None:
        self.rejections.labels(reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
