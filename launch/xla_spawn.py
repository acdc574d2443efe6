#!/usr/bin/env python
"""``python launch/xla_spawn.py [hydra overrides]``: the XLA launcher as a script.

The same as ``python -m largebatch.launch.xla`` (see that module): one training replica
per XLA device, e.g. ``PJRT_DEVICE=TPU python launch/xla_spawn.py optimizer=lars``.
"""

import sys

from largebatch.launch.xla import main

if __name__ == "__main__":
    sys.exit(main())
