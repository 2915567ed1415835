"""The model framework: model types, methods, resource specs and the method context."""

from swamp.models.framework import (
    Arg,
    Method,
    MethodContext,
    MethodFailed,
    ModelType,
    ResourceSpec,
)

__all__ = ["Arg", "Method", "MethodContext", "MethodFailed", "ModelType", "ResourceSpec"]
