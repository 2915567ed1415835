"""Workflow definitions: ``workflows/NAME.toml`` → a checked tree of jobs and steps.

A workflow has jobs; a job has steps; a step runs a *task* — a model method (``modelIdOrName``,
or ``modelType`` with ``modelName``, plus ``methodName`` and ``inputs``) or another workflow
(``workflowIdOrName``). Jobs depend on jobs and steps on steps of their job (``dependsOn``, with a
condition tree); placement (``target``, ``labels``, ``platform``, ``queueTimeout``, the
execution ``timeout``, ``priority``, and ``affinity`` on the workflow and its jobs) is
inherited workflow → job → step, the child winning (an explicit empty ``labels`` clears).
``forEach`` runs a step once per item of a list.

:func:`parse` turns the TOML tree into these values and reports every problem with its place in
the file (``jobs[1].steps[0].task.methodName``), never stopping at the first; an unknown key is
a problem with a did-you-mean. What needs the repo (do the models exist?) is
:func:`check_against`, given lookups. Nothing here does I/O.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from swamp.domain.durations import parse_duration, parse_timeout
from swamp.domain.expressions import ExpressionError, check_templates, has_template, render
from swamp.domain.labels import check_labels
from swamp.domain.priority import MAX_PRIORITY, MIN_PRIORITY
from swamp.domain.priority import RANGE as PRIORITY_RANGE
from swamp.errors import UnknownMethod, UserError

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MAX_NESTING = 10
CONDITIONS = ("succeeded", "failed", "completed", "skipped", "always", "and", "or", "not")


def check_workflow_name(name: object) -> str:
    """A workflow name someone asked for: the file name rule, checked before any file is
    looked at (a name too long for the file system, or one that is no text, is one line)."""
    if isinstance(name, str) and NAME.fullmatch(name):
        return name
    if isinstance(name, str) and len(name) > 64:
        shown = f"{name[:40]!r}… ({len(name)} characters)"
    else:
        shown = repr(name)
    raise UserError(
        f"invalid workflow name {shown}: use 1-64 lowercase letters, digits, '-' or '_', "
        "starting with a letter or digit"
    )


@dataclass(frozen=True)
class Problem:
    place: str
    message: str
    warning: bool = False

    def line(self) -> str:
        return f"{self.place}: {self.message}" if self.place else self.message


@dataclass(frozen=True)
class Condition:
    type: str = "succeeded"
    conditions: tuple[Condition, ...] = ()

    def holds(self, status: str | None) -> bool:
        """Is it true of a dependency whose status is ``status``?"""
        if self.type == "always":
            return True
        if self.type == "completed":
            return status in ("succeeded", "failed")
        if self.type in ("succeeded", "failed", "skipped"):
            return status == self.type
        if self.type == "and":
            return all(c.holds(status) for c in self.conditions)
        if self.type == "or":
            return any(c.holds(status) for c in self.conditions)
        if self.type == "not":
            return not self.conditions[0].holds(status)
        return False


@dataclass(frozen=True)
class Dependency:
    name: str
    condition: Condition = Condition()


@dataclass(frozen=True)
class Placement:
    """Placement fields as written; ``None`` means "not set here" (inherit)."""

    target: str | None = None
    labels: dict[str, str] | None = None
    platform: str | None = None
    queue_timeout: str | None = None  # seconds (a number) or a duration; "0" waits forever
    affinity: bool | None = None
    timeout: str | None = None  # how long a step may run once dispatched (a duration)
    priority: int | None = None  # among waiting steps, higher goes first (domain.priority)

    def under(self, parent: Placement) -> Placement:
        """This level's fields over its parent's: the child wins wherever it sets a field."""
        return Placement(
            target=self.target if self.target is not None else parent.target,
            labels=self.labels if self.labels is not None else parent.labels,
            platform=self.platform if self.platform is not None else parent.platform,
            queue_timeout=(
                self.queue_timeout if self.queue_timeout is not None else parent.queue_timeout
            ),
            affinity=self.affinity if self.affinity is not None else parent.affinity,
            timeout=self.timeout if self.timeout is not None else parent.timeout,
            priority=self.priority if self.priority is not None else parent.priority,
        )

    def is_remote(self) -> bool:
        return bool(self.target or self.labels or self.platform)


@dataclass(frozen=True)
class Task:
    kind: str  # model_method | workflow
    model: str | None = None  # modelIdOrName, or modelType
    model_name: str | None = None  # with modelType: the instance's name
    method: str | None = None
    workflow: str | None = None
    inputs: dict | str = field(default_factory=dict)

    @property
    def by_type(self) -> bool:
        return self.model_name is not None


@dataclass(frozen=True)
class ForEach:
    item: str
    items: str  # the expression (``in``)


@dataclass(frozen=True)
class Step:
    name: str
    task: Task
    description: str = ""
    depends_on: tuple[Dependency, ...] = ()
    weight: float = 0
    concurrency: int = 0
    allow_failure: bool = False
    guard: str | None = None
    for_each: ForEach | None = None
    placement: Placement = Placement()


@dataclass(frozen=True)
class Job:
    name: str
    steps: tuple[Step, ...]
    description: str = ""
    depends_on: tuple[Dependency, ...] = ()
    weight: float = 0
    concurrency: int = 0
    placement: Placement = Placement()


@dataclass(frozen=True)
class Workflow:
    name: str
    jobs: tuple[Job, ...]
    description: str = ""
    version: int = 1
    inputs: dict | None = None  # a JSON schema (type object, properties, required, …)
    concurrency: int = 0
    placement: Placement = Placement()

    def job(self, name: str) -> Job | None:
        return next((j for j in self.jobs if j.name == name), None)

    def placed_steps(self) -> bool:
        return any(
            s.placement.under(j.placement.under(self.placement)).is_remote()
            for j in self.jobs
            for s in j.steps
        )


# -- parsing -------------------------------------------------------------------------------------

_WORKFLOW_KEYS = [
    "name",
    "description",
    "version",
    "inputs",
    "jobs",
    "concurrency",
    "target",
    "labels",
    "platform",
    "queueTimeout",
    "timeout",
    "affinity",
    "priority",
    "id",
    "tags",
]
_JOB_KEYS = [
    "name",
    "description",
    "steps",
    "dependsOn",
    "weight",
    "concurrency",
    "target",
    "labels",
    "platform",
    "queueTimeout",
    "timeout",
    "affinity",
    "priority",
]
_STEP_KEYS = [
    "name",
    "description",
    "task",
    "dependsOn",
    "weight",
    "concurrency",
    "allowFailure",
    "guard",
    "forEach",
    "target",
    "labels",
    "platform",
    "queueTimeout",
    "timeout",
    "priority",
]
_TASK_KEYS = {
    "model_method": ("type", "modelIdOrName", "modelType", "modelName", "methodName", "inputs"),
    "workflow": ("type", "workflowIdOrName", "inputs"),
}


class _Reader:
    """Collects problems while reading one file."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, place: str, message: str, *, warning: bool = False) -> None:
        self.problems.append(Problem(place, message, warning))

    def keys(self, raw: dict, allowed, place: str) -> None:
        for key in raw:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), list(allowed), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                self.problem(
                    f"{place}.{key}" if place else str(key),
                    f"unknown key{hint} (keys here: {', '.join(allowed)})",
                )

    def table(self, raw, place: str) -> dict:
        if not isinstance(raw, dict):
            self.problem(place, "expected a table")
            return {}
        return raw

    def text(self, raw: dict, key: str, place: str, *, required=False, default=None):
        value = raw.get(key, default)
        if value is None:
            if required:
                self.problem(_at(place, key), "is required")
            return default
        if not isinstance(value, str) or not value:
            self.problem(_at(place, key), "expected a non-empty string")
            return default
        self.expressions(value, _at(place, key))
        return value

    def number(self, raw: dict, key: str, place: str, *, integer=False, default=0):
        value = raw.get(key, default)
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
            what = "a whole number ≥ 0" if integer else "a number ≥ 0"
            self.problem(_at(place, key), f"expected {what}")
            return default
        return value

    def flag(self, raw: dict, key: str, place: str):
        value = raw.get(key)
        if value is not None and not isinstance(value, bool):
            self.problem(_at(place, key), "expected true or false")
            return None
        return value

    def expressions(self, value, place: str) -> None:
        try:
            check_templates(value)
        except ExpressionError as exc:
            self.problem(place, exc.message)

    def placement(self, raw: dict, place: str, *, affinity: bool) -> Placement:
        labels = raw.get("labels")
        if labels is not None:
            if not isinstance(labels, dict):
                self.problem(_at(place, "labels"), "expected a table of k = v")
                labels = None
            else:
                literal = {k: v for k, v in labels.items() if not has_template(v)}
                try:
                    check_labels(literal, source=_at(place, "labels"))
                except UserError as exc:
                    self.problem(_at(place, "labels"), exc.message)
                self.expressions(labels, _at(place, "labels"))
        timeout = raw.get("queueTimeout")
        if timeout is not None:
            timeout = self.queue_timeout(timeout, _at(place, "queueTimeout"))
        return Placement(
            target=self.text(raw, "target", place),
            labels=labels,
            platform=self.text(raw, "platform", place),
            queue_timeout=timeout,
            affinity=self.flag(raw, "affinity", place) if affinity else None,
            timeout=self.run_timeout(raw.get("timeout"), _at(place, "timeout")),
            priority=self.priority(raw.get("priority"), _at(place, "priority")),
        )

    def priority(self, value, place: str) -> int | None:
        """``priority``: a whole number in the allowed range (no expression: it is known
        before the run starts, like the file's structure)."""
        if value is None:
            return None
        number = isinstance(value, int) and not isinstance(value, bool)
        if number and MIN_PRIORITY <= value <= MAX_PRIORITY:
            return value
        self.problem(place, f"expected {PRIORITY_RANGE}, got {value!r}")
        return None

    def run_timeout(self, value, place: str) -> str | None:
        """``timeout``: seconds (a positive number) or a duration such as 30m; 0 for none."""
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return f"{math.ceil(value)}s"
        if isinstance(value, str):
            try:
                parse_timeout(value.strip(), what="timeout")
            except UserError as exc:
                self.problem(place, exc.message)
                return None
            return value.strip()
        if value == 0 and not isinstance(value, bool):
            return "0"  # no limit at all
        self.problem(place, "expected seconds (a positive number) or a duration such as 30m")
        return None

    def queue_timeout(self, value, place: str) -> str | None:
        if isinstance(value, bool):
            self.problem(place, "expected seconds (a number) or a duration such as 5m")
            return None
        if isinstance(value, (int, float)):
            if value < 0:
                self.problem(place, "expected seconds ≥ 0 (0 waits forever)")
                return None
            return f"{value:g}s" if value else "0"
        if isinstance(value, str):
            text = value.strip()
            if text.rstrip("smhdw") == "0":
                return "0"
            try:
                parse_duration(text, what="queueTimeout")
            except UserError as exc:
                self.problem(place, exc.message)
                return None
            return text
        self.problem(place, "expected seconds (a number) or a duration such as 5m")
        return None

    def depends(self, raw: dict, place: str, noun: str) -> tuple[Dependency, ...]:
        items = raw.get("dependsOn", [])
        if not isinstance(items, list):
            self.problem(_at(place, "dependsOn"), f"expected a list of {{ {noun} = …, … }}")
            return ()
        out = []
        for i, item in enumerate(items):
            where = f"{_at(place, 'dependsOn')}[{i}]"
            if isinstance(item, str):
                self.problem(
                    where,
                    f'write {{ {noun} = "{item}", condition = {{ type = "succeeded" }} }}',
                )
                continue
            item = self.table(item, where)
            self.keys(item, (noun, "condition"), where)
            name = item.get(noun)
            if not isinstance(name, str) or not name:
                self.problem(_at(where, noun), "is required")
                continue
            condition = self.condition(
                item.get("condition", {"type": "succeeded"}), _at(where, "condition")
            )
            out.append(Dependency(name, condition))
        return tuple(out)

    def condition(self, raw, place: str) -> Condition:
        raw = self.table(raw, place)
        kind = raw.get("type")
        if kind not in CONDITIONS:
            self.problem(_at(place, "type"), f"expected one of {', '.join(CONDITIONS)}")
            return Condition()
        if kind in ("and", "or"):
            self.keys(raw, ("type", "conditions"), place)
            items = raw.get("conditions")
            if not isinstance(items, list) or len(items) < 2:
                self.problem(_at(place, "conditions"), f"'{kind}' needs a list of 2 or more")
                return Condition()
            return Condition(
                kind,
                tuple(
                    self.condition(c, f"{_at(place, 'conditions')}[{i}]")
                    for i, c in enumerate(items)
                ),
            )
        if kind == "not":
            self.keys(raw, ("type", "condition"), place)
            return Condition(kind, (self.condition(raw.get("condition"), _at(place, "condition")),))
        self.keys(raw, ("type",), place)
        return Condition(kind)

    def task(self, raw, place: str) -> Task | None:
        raw = self.table(raw, place)
        kind = raw.get("type")
        if kind not in _TASK_KEYS:
            self.problem(_at(place, "type"), "expected model_method or workflow")
            return None
        self.keys(raw, _TASK_KEYS[kind], place)
        inputs = raw.get("inputs", {})
        if not isinstance(inputs, (dict, str)):
            self.problem(_at(place, "inputs"), "expected a table (or one ${{ }} expression)")
            inputs = {}
        self.expressions(inputs, _at(place, "inputs"))
        if kind == "workflow":
            return Task(
                kind,
                workflow=self.text(raw, "workflowIdOrName", place, required=True),
                inputs=inputs,
            )
        by_name, by_type = raw.get("modelIdOrName"), raw.get("modelType")
        if (by_name is None) == (by_type is None):
            self.problem(place, "needs exactly one of modelIdOrName or modelType (with modelName)")
            return None
        method = self.text(raw, "methodName", place, required=True)
        if by_name is not None:
            return Task(
                kind, model=self.text(raw, "modelIdOrName", place), method=method, inputs=inputs
            )
        return Task(
            kind,
            model=self.text(raw, "modelType", place),
            model_name=self.text(raw, "modelName", place, required=True),
            method=method,
            inputs=inputs,
        )

    def step(self, raw, place: str) -> Step | None:
        raw = self.table(raw, place)
        self.keys(raw, _STEP_KEYS, place)
        name = self.text(raw, "name", place, required=True)
        task = self.task(raw.get("task"), _at(place, "task")) if "task" in raw else None
        if "task" not in raw:
            self.problem(_at(place, "task"), "is required")
        for_each = None
        if "forEach" in raw:
            fe = self.table(raw["forEach"], _at(place, "forEach"))
            self.keys(fe, ("item", "in"), _at(place, "forEach"))
            item, items = fe.get("item"), fe.get("in")
            if not isinstance(item, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", item):
                self.problem(_at(place, "forEach.item"), "expected a name such as w")
            elif not isinstance(items, str) or not has_template(items):
                self.problem(_at(place, "forEach.in"), "expected a ${{ … }} expression")
            else:
                self.expressions(items, _at(place, "forEach.in"))
                constant = _constant(items)
                if constant is not None and not isinstance(constant, (list, dict)):
                    self.problem(
                        _at(place, "forEach.in"),
                        f"gives {type(constant).__name__} {constant!r}, not a list",
                    )
                for_each = ForEach(item, items)
        guard = raw.get("guard")
        if guard is not None and (not isinstance(guard, str) or not has_template(guard)):
            self.problem(_at(place, "guard"), "expected one ${{ … }} expression")
            guard = None
        elif guard is not None:
            self.expressions(guard, _at(place, "guard"))
        if name is None or task is None:
            return None
        return Step(
            name=name,
            task=task,
            description=str(raw.get("description", "")),
            depends_on=self.depends(raw, place, "step"),
            weight=self.number(raw, "weight", place),
            concurrency=self.number(raw, "concurrency", place, integer=True),
            allow_failure=bool(self.flag(raw, "allowFailure", place)),
            guard=guard,
            for_each=for_each,
            placement=self.placement(raw, place, affinity=False),
        )

    def job(self, raw, place: str) -> Job | None:
        raw = self.table(raw, place)
        self.keys(raw, _JOB_KEYS, place)
        name = self.text(raw, "name", place, required=True)
        steps_raw = raw.get("steps")
        if not isinstance(steps_raw, list) or not steps_raw:
            self.problem(_at(place, "steps"), "needs at least one step ([[jobs.steps]])")
            steps_raw = []
        steps = [self.step(s, f"{place}.steps[{i}]") for i, s in enumerate(steps_raw)]
        if name is None:
            return None
        return Job(
            name=name,
            steps=tuple(s for s in steps if s is not None),
            description=str(raw.get("description", "")),
            depends_on=self.depends(raw, place, "job"),
            weight=self.number(raw, "weight", place),
            concurrency=self.number(raw, "concurrency", place, integer=True),
            placement=self.placement(raw, place, affinity=True),
        )


def explicit(raw: dict) -> dict:
    """The workflow file ``raw`` with what its jobs and steps leave to the defaults written
    out (for ``workflow show``): ``dependsOn`` (each with its ``condition``), ``concurrency``
    (``0``: no cap) on the workflow, each job and each step, and each step's
    ``allowFailure``. A value as written is kept as it is, even a wrong one (the file's
    problems are reported beside it); parts that are not tables are left alone."""

    def deps(node: dict) -> None:
        node.setdefault("dependsOn", [])
        if isinstance(node["dependsOn"], list):
            node["dependsOn"] = [
                {**d, "condition": d.get("condition", {"type": "succeeded"})}
                if isinstance(d, dict)
                else d
                for d in node["dependsOn"]
            ]

    out = dict(raw)
    out.setdefault("concurrency", 0)
    jobs = out.get("jobs")
    if not isinstance(jobs, list):
        return out
    out["jobs"] = []
    for job in jobs:
        if isinstance(job, dict):
            job = dict(job)
            deps(job)
            job.setdefault("concurrency", 0)
            steps = job.get("steps")
            if isinstance(steps, list):
                job["steps"] = []
                for step in steps:
                    if isinstance(step, dict):
                        step = dict(step)
                        deps(step)
                        step.setdefault("concurrency", 0)
                        step.setdefault("allowFailure", False)
                    job["steps"].append(step)
        out["jobs"].append(job)
    return out


def _constant(text: str) -> object:
    """The value of an expression that needs no names (else ``None``): ``${{ 'a' }}``."""
    try:
        return render(text, {})
    except ExpressionError:
        return None


def _at(place: str, key: str) -> str:
    return f"{place}.{key}" if place else key


def parse(raw: dict, *, name: str) -> tuple[Workflow | None, list[Problem]]:
    """The workflow in ``raw`` (a parsed TOML file named ``name``.toml), and its problems."""
    r = _Reader()
    r.keys(raw, _WORKFLOW_KEYS, "")
    declared = raw.get("name", name)
    if declared != name:
        r.problem("name", f"is {declared!r} but the file is {name}.toml: they must agree")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        r.problem("name", "expected lowercase letters, digits, '-' and '_' (at most 64)")
    inputs = raw.get("inputs")
    if inputs is not None:
        inputs = r.table(inputs, "inputs")
        inputs = {"type": "object", **inputs}
        try:
            import fastjsonschema

            fastjsonschema.compile(inputs)
        except Exception as exc:  # the library raises its own definition errors
            r.problem("inputs", f"is not a usable JSON schema: {exc}")
    jobs_raw = raw.get("jobs")
    if not isinstance(jobs_raw, list) or not jobs_raw:
        r.problem("jobs", "needs at least one job ([[jobs]])")
        jobs_raw = []
    jobs = [r.job(j, f"jobs[{i}]") for i, j in enumerate(jobs_raw)]
    version = raw.get("version", 1)
    workflow = Workflow(
        name=name,
        jobs=tuple(j for j in jobs if j is not None),
        description=str(raw.get("description", "")),
        version=version if isinstance(version, int) else 1,
        inputs=inputs,
        concurrency=r.number(raw, "concurrency", "", integer=True),
        placement=r.placement(raw, "", affinity=True),
    )
    r.problems += _graph_problems(workflow, jobs_raw)
    return workflow, r.problems


def _graph_problems(workflow: Workflow, jobs_raw: list) -> list[Problem]:
    out: list[Problem] = []
    seen: dict[str, int] = {}
    for i, job in enumerate(workflow.jobs):
        if job.name in seen:
            out.append(Problem(f"jobs[{i}].name", f"duplicate job name {job.name!r}"))
        seen[job.name] = i
        steps: dict[str, int] = {}
        for k, step in enumerate(job.steps):
            if step.name in steps:
                out.append(
                    Problem(f"jobs[{i}].steps[{k}].name", f"duplicate step name {step.name!r}")
                )
            steps[step.name] = k
        for k, step in enumerate(job.steps):
            for d, dep in enumerate(step.depends_on):
                if dep.name not in steps:
                    out.append(
                        Problem(
                            f"jobs[{i}].steps[{k}].dependsOn[{d}].step",
                            f"no step {dep.name!r} in job {job.name!r}",
                        )
                    )
        cycle = find_cycle({s.name: [d.name for d in s.depends_on] for s in job.steps})
        if cycle:
            out.append(Problem(f"jobs[{i}].steps", f"dependency cycle: {' -> '.join(cycle)}"))
    for i, job in enumerate(workflow.jobs):
        for d, dep in enumerate(job.depends_on):
            if dep.name not in seen:
                out.append(Problem(f"jobs[{i}].dependsOn[{d}].job", f"no job {dep.name!r}"))
    cycle = find_cycle({j.name: [d.name for d in j.depends_on] for j in workflow.jobs})
    if cycle:
        out.append(Problem("jobs", f"dependency cycle: {' -> '.join(cycle)}"))
    for i, job in enumerate(workflow.jobs):
        job_placement = job.placement.under(workflow.placement)
        if job_placement.affinity and not any(
            s.placement.under(job_placement).is_remote() for s in job.steps
        ):
            out.append(Problem(f"jobs[{i}].affinity", "no step of it is placed", warning=True))
        for k, step in enumerate(job.steps):
            effective = step.placement.under(job_placement)
            if effective.queue_timeout is not None and not effective.is_remote():
                out.append(
                    Problem(
                        f"jobs[{i}].steps[{k}].queueTimeout",
                        "has no effect: the step has no placement (target, labels or platform)",
                        warning=True,
                    )
                )
    return out


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A dependency cycle as ``[a, b, a]``, or ``None`` (unknown names are ignored)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in graph.get(node, ()):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


# -- checks that need the repo --------------------------------------------------------------------


@dataclass(frozen=True)
class MethodInfo:
    """What validation needs to know of a model's method."""

    required: tuple[str, ...]  # arguments with no value from the model's own args
    known: tuple[str, ...]


ModelLookup = Callable[[str, str | None, str], MethodInfo]  # (model, model_name, method) → info
WorkflowLookup = Callable[[str], "Workflow | None"]


def check_against(
    workflow: Workflow,
    *,
    method_of: ModelLookup,
    workflow_of: WorkflowLookup,
    chain: tuple[str, ...] = (),
) -> list[Problem]:
    """Models, methods, required arguments and nested workflows (depth, cycles)."""
    out: list[Problem] = []
    chain = (*chain, workflow.name)
    for i, job in enumerate(workflow.jobs):
        for k, step in enumerate(job.steps):
            place = f"jobs[{i}].steps[{k}].task"
            task = step.task
            if task.kind == "model_method":
                model, method = task.model, task.method  # (both present: the reader's rule)
                if model is None or method is None or has_template(model) or has_template(method):
                    continue
                try:
                    info = method_of(model, task.model_name, method)
                except UnknownMethod as exc:
                    out.append(Problem(f"{place}.methodName", exc.message))
                    continue
                except UserError as exc:
                    key = "modelType" if task.by_type else "modelIdOrName"
                    out.append(Problem(f"{place}.{key}", exc.message))
                    continue
                if isinstance(task.inputs, dict):
                    for arg in info.required:
                        if arg not in task.inputs:
                            out.append(
                                Problem(
                                    f"{place}.inputs",
                                    f"method {task.method!r} needs argument {arg!r}",
                                )
                            )
                    for arg in task.inputs:
                        if arg not in info.known:
                            out.append(
                                Problem(
                                    f"{place}.inputs.{arg}",
                                    f"method {task.method!r} has no argument {arg!r} "
                                    f"(arguments: {', '.join(info.known) or 'none'})",
                                )
                            )
            elif task.workflow and not has_template(task.workflow):
                if task.workflow in chain:
                    cycle = " -> ".join((*chain, task.workflow))
                    out.append(Problem(f"{place}.workflowIdOrName", f"workflow cycle: {cycle}"))
                    continue
                if len(chain) >= MAX_NESTING:
                    out.append(
                        Problem(
                            f"{place}.workflowIdOrName",
                            f"workflows nest at most {MAX_NESTING} deep",
                        )
                    )
                    continue
                child = workflow_of(task.workflow)
                if child is None:
                    out.append(
                        Problem(f"{place}.workflowIdOrName", f"no workflow {task.workflow!r}")
                    )
                    continue
                required = (child.inputs or {}).get("required") or []
                if isinstance(task.inputs, dict):
                    for name in required:
                        if name not in task.inputs:
                            out.append(
                                Problem(
                                    f"{place}.inputs",
                                    f"workflow {child.name!r} needs input {name!r}",
                                )
                            )
                nested = check_against(
                    child, method_of=method_of, workflow_of=workflow_of, chain=chain
                )
                out += [
                    Problem(f"{place} → {child.name}: {p.place}", p.message, p.warning)
                    for p in nested
                    if not p.warning
                ]
    return out
