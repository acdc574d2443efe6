"""Names a package re-exports from its modules, each module loaded on first use (PEP 562).

``largebatch.data`` and ``largebatch.data.pipelines`` keep ``from largebatch.data import X``
working without importing torch, Pillow, DALI or nvJPEG when the package is imported (the config
and the command-line tools import it for its map alone). Each lists its names once, as plain
imports under ``if TYPE_CHECKING:`` (what type checkers, IDEs and readers see), and passes the
same names with their modules here; ``tests/test_layers.py`` checks that the two agree.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package``, whose names ``exports`` maps to the
    module under ``package`` that defines each (``"augment"``, ``"pipelines.torchvision"``)."""
    names = sorted(exports)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        import sys

        return sorted({*vars(sys.modules[package]), *names})

    return names, __getattr__, __dir__
