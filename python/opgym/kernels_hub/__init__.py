"""A local `kernels` repository variant for opgym: `kernels` imports this file and looks up
`layers.<NAME>`. It re-exports the installed opgym package's layers, so no build is downloaded."""
from opgym import layers  # noqa: F401

__all__ = ["layers"]
