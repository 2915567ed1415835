"""Reading ``workflows/*.toml`` from a repo, and checking a workflow against the repo's models."""

from __future__ import annotations

from dataclasses import dataclass, field

from swamp.compat import tomllib
from swamp.domain.names import check_instance_name
from swamp.domain.workflow import MethodInfo, Problem, Workflow, check_against, parse
from swamp.errors import NotFound, UserError
from swamp.plugins import ModelRegistry
from swamp.repo import ModelInstance, Repo


@dataclass
class Loaded:
    name: str
    workflow: Workflow | None
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if not p.warning]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.warning]


class Workflows:
    def __init__(self, repo: Repo, registry: ModelRegistry) -> None:
        self.repo = repo
        self.registry = registry
        self.dir = repo.root / "workflows"

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.toml")) if self.dir.is_dir() else []

    def read(self, name: str) -> Loaded:
        """Parse one file (its own problems only)."""
        path = self.dir / f"{name}.toml"
        try:
            is_file = "/" not in name and not name.startswith(".") and path.is_file()
        except (OSError, ValueError):  # too long for the file system, a NUL: no such file
            is_file = False
        if not is_file:
            if len(name) > 64:
                name = f"{name[:40]}…"
            known = ", ".join(self.names()) or "none yet: 'swamp workflow create NAME'"
            raise NotFound(f"no workflow {name!r} in {self.dir} (workflows: {known})")
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            return Loaded(name, None, [Problem("", f"{path.name} is not valid TOML: {exc}")])
        workflow, problems = parse(raw, name=name)
        return Loaded(name, workflow, problems)

    def load(self, name: str) -> Loaded:
        """Parse and check against the repo: models, methods, arguments, nested workflows."""
        loaded = self.read(name)
        if loaded.workflow is not None and not loaded.errors:
            loaded.problems += check_against(
                loaded.workflow, method_of=self.method_info, workflow_of=self._child
            )
        return loaded

    def checked(self, name: str) -> Workflow:
        """The workflow, or one ``UserError`` listing every problem (exit 2)."""
        loaded = self.load(name)
        if loaded.errors or loaded.workflow is None:
            lines = "\n".join(f"  {p.line()}" for p in loaded.errors)
            raise UserError(f"workflow {name!r} is not valid:\n{lines}")
        return loaded.workflow

    def _child(self, name: str) -> Workflow | None:
        try:
            loaded = self.read(name)
        except NotFound:
            return None
        return loaded.workflow if not loaded.errors else None

    def instance(self, model: str, model_name: str | None) -> ModelInstance:
        if model_name is not None:  # a type with an instance name of the step's choosing
            if "${{" not in model_name:  # a template is checked once it is rendered
                check_instance_name(model_name, what="modelName")
            self.registry.runnable(model)
            return ModelInstance(name=model_name, type=model, args={}, source="workflow")
        return self.repo.resolve_model(model)

    def method_info(self, model: str, model_name: str | None, method: str) -> MethodInfo:
        instance = self.instance(model, model_name)
        model_type = self.registry.runnable(instance.type)
        found = model_type.method(method)  # UserError names the methods there are
        return MethodInfo(
            required=tuple(
                a.name for a in found.args if a.required and a.name not in instance.args
            ),
            known=tuple(a.name for a in found.args),
        )
