"""``largebatch-train -m ...``: a Hydra multirun, one training run per job, and a summary.

Hydra's sweeper expands the overrides (``global_batch_size=256,1024 optimizer=sgd,lars``: 4
jobs) and its launcher runs :func:`train_job` once per job: the basic launcher one after
another in this process, ``hydra/launcher=submitit_local`` in subprocesses,
``hydra/launcher=submitit_slurm`` as a SLURM job array (the ``slurm`` extra:
``pip install '/path/to/largebatch[slurm]'``, the clone's path;
``conf/hydra/launcher/slurm.yaml`` is an example). Every job trains in its own run directory,
``hydra.sweep.dir/hydra.sweep.subdir`` (``<output_root>/multirun-<time>/<job number>``), next
to Hydra's record of the job (``.hydra/``). When every job has ended, :func:`summary_table`
prints one line per job: its overrides, best top-1, training time and exit status.

A job's bad input or non-finite loss ends that job with its exit code (the table shows it)
and the sweep goes on; a bug stops the sweep with its traceback.

The first SIGTERM or SIGINT (a scheduler's preemption or time limit, ``scancel``, Ctrl-C)
stops the sweep: the running job finishes its step, saves a checkpoint and ends with 75, the
jobs after it are not started, the table lists them, and the sweep exits 75 with the command
that resumes it (the same sweep, ``resume=auto``, in the same ``hydra.sweep.dir``: finished
jobs end at once, the stopped one continues from its checkpoint, the others start). A signal
while a job is being set up (before its first step) stops it at once, with nothing to save.
A second Ctrl-C interrupts at once (130).

A continued sweep (the same ``hydra.sweep.dir``) finds each job's run by the job's number,
Hydra's folder name; a job whose run-relevant overrides (``largebatch.engine.resume.RUN_KEYS``:
``seed=1`` where the folder's run was made with ``seed=0``, as a value list given in another
order does) differ from those of the run in its folder is refused with exit 2, naming the job,
both override sets and the folder that holds its own run, and the folder's ``.hydra`` record is
put back as it was. A job that matches its folder continues. The check of every resume, that a
checkpoint's config matches the run's in those keys, applies too (also with the submitit launchers). This holds for the basic launcher, whose jobs run
one after another in this process; with the submitit launchers every job is a process (or a
SLURM job) of its own, which the scheduler signals itself.
"""

from __future__ import annotations

import copy
import os
import shlex
import signal
import sys
import time
from contextlib import contextmanager
from types import FrameType
from typing import Any, Iterator, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from largebatch.errors import STOP_SIGNALS

__all__ = [
    "JOB_FIELDS", "NOT_STARTED", "resume_command", "run_multirun", "stopping_signal", "summary_table", "train_job",
]

# What train_job returns for each job (a plain dict: it crosses process boundaries).
JOB_FIELDS = ("job", "overrides", "exit_code", "best_top1", "time_to_target_s", "wall_time_s", "run_dir", "error")

NOT_STARTED = "not started"  # the error cell of a job a stopped sweep did not start

_STOP_SIGNALS = STOP_SIGNALS  # SIGTERM, SIGINT, SIGHUP


class _SweepStop:
    """Whether a stop signal reached this sweep, and whether a job is being run right now.

    Signal handlers only set state or raise (nothing else is safe in a handler). While a job
    trains, its own preemption hook holds SIGTERM/SIGINT (step, save, exit 75) and gives them
    back to this one afterwards.
    """

    def __init__(self) -> None:
        self.signal_name: Optional[str] = None
        self.in_job = False

    def handle(self, signum: int, frame: Optional[FrameType]) -> None:
        from largebatch.errors import Preempted

        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self.signal_name == "SIGINT":
            raise KeyboardInterrupt  # second Ctrl-C: stop now (exit 130)
        self.signal_name = self.signal_name or name
        print(f"largebatch: {name} received: the sweep stops after the current job", file=sys.stderr, flush=True)
        if self.in_job:  # a job being set up (training installs its own handler): nothing to save yet
            raise Preempted(f"{name} before the job's first step; nothing to save", signal_name=name)


_SWEEP = _SweepStop()

# A continued sweep's job folders as they were before Hydra rewrote their .hydra record:
# absolute folder -> (its task overrides, {file name: bytes} of its .hydra folder)
_EARLIER_JOBS: dict[str, tuple[list[str], dict[str, bytes]]] = {}


def _earlier_jobs(overrides: Sequence[str]) -> dict[str, tuple[list[str], dict[str, bytes]]]:
    """The job folders under the ``hydra.sweep.dir=`` of ``overrides`` that hold a run."""
    import yaml

    dirs = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "hydra.sweep.dir"]
    if not dirs or not os.path.isdir(dirs[-1]):
        return {}
    found = {}
    for entry in os.scandir(dirs[-1]):
        record = os.path.join(entry.path, ".hydra")
        if not entry.is_dir() or not os.path.isfile(os.path.join(record, "overrides.yaml")):
            continue
        try:
            files = {}
            for f in os.scandir(record):
                if f.is_file():
                    with open(f.path, "rb") as fh:
                        files[f.name] = fh.read()
            task = yaml.safe_load(files["overrides.yaml"])
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(task, list):
            found[os.path.abspath(entry.path)] = ([str(t) for t in task], files)
    return found


def _run_overrides(task: Sequence[str]) -> dict[str, str]:
    """``key -> value`` of the task overrides the run's result depends on (RUN_KEYS; a config
    group choice such as ``model=resnet18`` counts under its group)."""
    from largebatch.engine.resume import RUN_KEYS

    out = {}
    for item in task:
        key, _, value = item.partition("=")
        key = key.lstrip("+~")
        if any(key == p.rstrip(".") or (p.endswith(".") and key.startswith(p)) for p in RUN_KEYS):
            out[key] = value
    return out


def _text(overrides: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(overrides.items())) or "no such override"


def _other_jobs_run(output_dir: str, task: Sequence[str]) -> Optional[str]:
    """Why this job must not continue the run in its folder (another job's), or None."""
    earlier = _EARLIER_JOBS.get(os.path.abspath(output_dir))
    if earlier is None:
        return None
    before, files = earlier
    now, was = _run_overrides(task), _run_overrides(before)
    if now == was:
        return None
    for name, data in files.items():  # Hydra rewrote the folder's record for this job: put it back
        with open(os.path.join(output_dir, ".hydra", name), "wb") as f:
            f.write(data)
    own = [d for d, (t, _) in _EARLIER_JOBS.items() if _run_overrides(t) == now]
    where = f"its own run is in {own[0]}" if own else "no folder of this sweep holds its run"
    return (f"{output_dir} holds the run of {_text(was)}, not {_text(now)} ({where}); a continued sweep "
            f"must list its values in the order of the sweep it continues, or use a new hydra.sweep.dir")


@contextmanager
def _stop_on_signals() -> Iterator[_SweepStop]:
    """Install the sweep's SIGTERM/SIGINT handler for the duration of a sweep (main thread only)."""
    global _SWEEP
    _SWEEP = _SweepStop()
    previous = {}
    for sig in _STOP_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, _SWEEP.handle)
        except ValueError:  # not the main thread (embedded use): no handler
            pass
    try:
        yield _SWEEP
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _distributed_env_from_submitit() -> None:
    """In a submitit job of several tasks, set torchrun's variables (RANK, WORLD_SIZE, ...).

    Each SLURM task is one rank of the run; the backend reads the same variables torchrun
    sets. GPU visibility is left alone: each rank picks ``LOCAL_RANK``'s device.
    """
    if "SUBMITIT_EXECUTOR" not in os.environ and "SUBMITIT_FOLDER" not in os.environ:
        return
    import submitit

    env = submitit.JobEnvironment()
    if env.num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def _with_recipe(cfg: DictConfig, hc: Any) -> DictConfig:
    """The job's config, on ``data=imagenet`` with the published recipe for its batch, as a single
    run composes it (Hydra's sweeper composed the job without it)."""
    from hydra.core.global_hydra import GlobalHydra

    from largebatch.config.compose import compose_with_recipe, hydra_errors, hydra_session, recipe_applies

    if not recipe_applies(cfg, hc.runtime.choices):
        return copy.deepcopy(cfg)
    with hydra_errors():
        if GlobalHydra.instance().is_initialized():  # the basic launcher: this process's Hydra
            return compose_with_recipe(list(hc.overrides.task))[0]
        with hydra_session():  # a submitit job in a process of its own
            return compose_with_recipe(list(hc.overrides.task))[0]


def train_job(cfg: DictConfig) -> dict[str, Any]:
    """One job of a multirun: train in Hydra's job directory; return the job's row.

    Hydra calls it with the job's composed config (the ``hydra`` node removed);
    ``HydraConfig`` holds the job's number, overrides and output directory.
    """
    from hydra.core.hydra_config import HydraConfig

    from largebatch.config import check_composed, to_train_config
    from largebatch.errors import EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE, ConfigError, exit_code
    from largebatch.run import run

    hc = HydraConfig.get()
    row: dict[str, Any] = dict.fromkeys(JOB_FIELDS)
    row.update(job=hc.job.num, overrides=" ".join(hc.overrides.task), run_dir=hc.runtime.output_dir)
    if _SWEEP.signal_name:  # the sweep was stopped: Hydra still hands us its remaining jobs
        row.update(exit_code=EXIT_PREEMPTED, error=NOT_STARTED)
        return row
    try:
        raw = _with_recipe(cfg, hc)
        refused = None
    except ConfigError as e:  # e.g. a model the ImageNet recipe does not cover: this job's bad input
        raw, refused = cfg, str(e)
    OmegaConf.set_readonly(raw, False)
    raw.run_dir = hc.runtime.output_dir
    refused = refused or _other_jobs_run(hc.runtime.output_dir, hc.overrides.task)
    if refused:
        row.update(exit_code=EXIT_USAGE, error=refused, wall_time_s=0.0)
        print(f"largebatch: job {row['job']} ({row['overrides']}): error: {refused}", file=sys.stderr)
        return row
    _distributed_env_from_submitit()
    start = time.monotonic()
    try:
        _SWEEP.in_job = True
        summary = run(to_train_config(check_composed(raw)), raw)
        _SWEEP.in_job = False
        row.update(exit_code=EXIT_OK, best_top1=summary.get("best_top1"),
                   time_to_target_s=summary.get("time_to_target_s"), wall_time_s=summary.get("wall_time_s"))
    except Exception as e:
        _SWEEP.in_job = False
        code = exit_code(e)
        if code is None:
            raise  # a bug stops the sweep with its traceback
        row.update(exit_code=code, error=f"preempted: {e}" if code == EXIT_PREEMPTED else str(e))
        if code == EXIT_PREEMPTED:  # the job's preemption hook took the signal: stop the sweep
            _SWEEP.signal_name = _SWEEP.signal_name or stopping_signal(e)
    if row["wall_time_s"] is None:
        row["wall_time_s"] = round(time.monotonic() - start, 2)
    if row["error"]:
        print(f"largebatch: job {row['job']} ({row['overrides']}): error: {row['error']}", file=sys.stderr)
    return row


def stopping_signal(error: BaseException) -> str:
    """The name of the signal that stopped a job (``"SIGTERM"``): the ``signal_name`` of the
    ``Preempted`` it raised; "a signal" where this process got none (another rank did)."""
    from largebatch.errors import Preempted

    if isinstance(error, Preempted) and error.signal_name:
        return error.signal_name
    return "a signal"


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def summary_table(rows: Sequence[dict[str, Any]], sweep_dir: Optional[str] = None) -> str:
    """The jobs of a multirun, one line each: overrides, best top-1, time to target, time, exit.

    The overrides every job shares go in the title; each line names what its job changes.
    """
    per_job = [r["overrides"].split() for r in rows]
    shared = [o for o in per_job[0] if all(o in job for job in per_job)] if len(per_job) > 1 else []
    header = ("job", "overrides", "best top-1 %", "to target s", "train s", "exit")
    lines = [
        (str(r["job"]), " ".join(o for o in job if o not in shared) or "(none)", _cell(r["best_top1"], ".2f"),
         _cell(r["time_to_target_s"], ".1f"), _cell(r["wall_time_s"], ".1f"),
         str(r["exit_code"]) + (f" {r['error']}" if r["error"] else ""))
        for r, job in zip(rows, per_job)
    ]
    widths = [max(len(row[i]) for row in (header, *lines)) for i in range(len(header) - 1)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    title = f"largebatch: {len(rows)} job(s)" + (f" in {sweep_dir}" if sweep_dir else "")
    if shared:
        title += f", all with {' '.join(shared)}"
    return "\n".join([title, fmt.format(*header), *(fmt.format(*row) for row in lines)])


def resume_command(overrides: Sequence[str], sweep_dir: str) -> str:
    """The command that continues a stopped sweep: the same sweep, ``resume=auto``, same directory."""
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("hydra.sweep.dir", "resume")]
    return shlex.join(["largebatch-train", "-m", *kept, f"hydra.sweep.dir={sweep_dir}", "resume=auto"])


def run_multirun(overrides: Sequence[str]) -> int:
    """Sweep ``overrides`` with Hydra's sweeper and launcher; print the table; the largest exit code."""
    from largebatch.config import check_overrides, hydra_errors, hydra_session

    check_overrides(overrides)
    _EARLIER_JOBS.clear()
    _EARLIER_JOBS.update(_earlier_jobs(overrides))
    with _stop_on_signals() as stop, hydra_errors(), hydra_session() as hydra:
        batches = hydra.multirun(config_name="train", task_function=train_job, overrides=list(overrides))
    rows = [job.return_value for batch in batches for job in batch]
    sweep_dir = os.path.dirname(rows[0]["run_dir"]) if rows else None
    print(summary_table(rows, sweep_dir), flush=True)
    if stop.signal_name and sweep_dir is not None:
        waiting = [str(r["job"]) for r in rows if r["error"] == NOT_STARTED]
        print(f"largebatch: sweep stopped ({stop.signal_name}); jobs not started: {' '.join(waiting) or 'none'}; "
              f"continue with: {resume_command(overrides, os.path.abspath(sweep_dir))}", file=sys.stderr, flush=True)
    return max((r["exit_code"] for r in rows), default=0)
