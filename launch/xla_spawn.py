#!/usr/bin/env python
"""``python launch/xla_spawn.py [hydra overrides]``: the XLA launcher as a script.

The same as ``python -m largebatch.launch.xla`` (see that module): one training replica
per XLA device, e.g. ``PJRT_DEVICE=TPU .venv-xla/bin/python launch/xla_spawn.py optimizer=lars``.
Run by a Python without torch, torch_xla or largebatch: one line naming what to do, exit 2.
"""

import importlib.util
import sys

_NEEDS = ("torch", "torch_xla", "hydra", "largebatch")


def _missing() -> list:
    """The modules this interpreter lacks (find_spec: nothing is imported)."""
    return [name for name in _NEEDS if importlib.util.find_spec(name) is None]


if __name__ == "__main__":
    missing = _missing()
    if missing:
        print(f"xla_spawn.py: {sys.executable} has no {', '.join(missing)}: run it with .venv-xla/bin/python "
              "(scripts/setup_env.sh xla sets it up) or another interpreter with largebatch[xla]", file=sys.stderr)
        sys.exit(2)
    from largebatch.launch.xla import main

    sys.exit(main())
