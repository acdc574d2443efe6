"""``python -m largebatch.launch.xla [hydra overrides]``: one training replica per XLA device.

The TPU-pod launch of Ying et al. 2018 / Wongpanich et al. 2020 in PyTorch/XLA form: the
same command runs on every host of a TPU slice (``gcloud ... ssh --worker=all``, see
``launch/tpu_pod.sh``); on each host ``torch_xla.launch`` starts one replica per local
device and PJRT joins the hosts into one job. Every replica runs
:func:`largebatch.run.run` with the same config (the given overrides plus ``backend=xla``),
composed and checked once per host before any replica starts, so a config mistake is one
message, not one per device.

    PJRT_DEVICE=TPU python -m largebatch.launch.xla optimizer=lars global_batch_size=32768
    PJRT_DEVICE=CPU CPU_NUM_DEVICES=4 python -m largebatch.launch.xla debug=smoke  # try-out

Exit codes are the CLI's (``largebatch.errors``): 0 done, 2 bad input (config, data, batch
sizes, a ``PJRT_DEVICE`` other than :data:`PJRT_DEVICES`, a ``CPU_NUM_DEVICES`` below 1), 3
non-finite loss, 74 a file of the run could not be written, 75 preempted after saving, 130
interrupted.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from largebatch.errors import EXIT_OK, ReplicaError, UsageError, error_line, exit_code

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["PJRT_DEVICES", "ReplicaError", "check_xla_environment", "launch_replicas", "main"]

# The runtimes torch_xla starts a PJRT client for (it reads the part before any "_", as in
# TPU_C_API; upper case); any other PJRT_DEVICE ended in KeyError: 'FOO' from its registry.
PJRT_DEVICES = ("TPU", "CPU", "CUDA", "NEURON")

# Replicas can be threads of one process (XLA:CPU, TPU v2/v3): build their config one at a time.
_CONFIG_LOCK = threading.Lock()


def launch_replicas(fn: Callable[..., Any], args: tuple = ()) -> None:
    """``torch_xla.launch(fn, args)`` after setting the XLA runtime environment.

    ``fn(index, *args)`` runs once per local device (``index``: the replica's global ordinal)
    and must be importable by name (it is pickled for spawned processes). Raises what a
    replica raised.
    """
    from largebatch.comm.xla_cpu_threads import prepare_xla_environment

    prepare_xla_environment()  # before the runtime starts, in this process and its children
    import torch_xla

    torch_xla.launch(fn, args=args)


def _run_replica(index: int, raw_cfg: DictConfig) -> None:
    """One replica: ``largebatch.run.run`` on this device; a mapped error becomes :class:`ReplicaError`."""
    from largebatch.config import to_train_config
    from largebatch.run import run

    with _CONFIG_LOCK:
        raw = copy.deepcopy(raw_cfg)
        cfg = to_train_config(raw)
    try:
        run(cfg, raw)
    except Exception as e:
        code = exit_code(e)
        if code is None:
            raise  # a bug: keep its traceback
        raise ReplicaError(code, error_line(e)) from None


def check_xla_environment() -> None:
    """Raise :class:`UsageError` naming ``PJRT_DEVICE`` when it is set to no runtime torch_xla has,
    or ``CPU_NUM_DEVICES`` when it is not a count (torch_xla's replicas died: a broken process pool).

    ``launch/tpu_vm.sh`` refuses the same values before Python starts (``launch/lib.sh`` check_env).
    """
    device = os.environ.get("PJRT_DEVICE", "")
    if device and device.split("_")[0] not in PJRT_DEVICES:
        raise UsageError(f"PJRT_DEVICE={device} is not a PJRT runtime: set it to {', '.join(PJRT_DEVICES[:-1])} "
                         f"or {PJRT_DEVICES[-1]} (upper case)")
    count = os.environ.get("CPU_NUM_DEVICES", "")
    if count and not (count.isascii() and count.isdigit() and int(count) >= 1):
        raise UsageError(f"CPU_NUM_DEVICES={count} is not a number of XLA:CPU devices: set it to 1 or more")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Compose the config once (with ``backend=xla``), then run a replica per XLA device."""
    from largebatch.config import compose_config, to_train_config

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        check_xla_environment()  # before the config, the runtime and every replica
        raw = compose_config([*args, "backend=xla"])
        to_train_config(raw)  # type errors show here, once
        launch_replicas(_run_replica, args=(raw,))
    except BaseException as e:  # KeyboardInterrupt too
        code = exit_code(e)
        if code is None:
            raise
        print(error_line(e), file=sys.stderr)
        return code
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
