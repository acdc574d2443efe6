"""Chaos soak: a 2-rank CPU job under ``launch/torchrun.sh``, interrupted at random and resumed.

Each interruption is a signal (SIGKILL, SIGTERM, SIGINT, SIGHUP) to a target of the running job:
one rank, the torchrun agent, the launch shell, the launcher's process group, or every process
of the job, at a seeded random moment of the launch: while it starts (a few seconds after the
launch, or at its first checkpoint if that comes sooner), or a fraction of a step after its
1st-3rd checkpoint (training, evaluating, saving). The moments in training are counted in the
job's own steps, not in seconds: on a loaded machine, where the ranks take 25 s to start, they
still come after a checkpoint (and the resume from it is tested), and on a quiet one a launch
still trains at most a few steps before its moment (so a short run holds every interruption).
After each, the soak waits for the launcher to end, checks that no process of the job outlived
it (a rank training on unsupervised holds the run lock), and relaunches with ``resume=auto``.
Once the interruptions are spent, the last launch runs to its end. The result must be the
uninterrupted run's: the last checkpoints of both runs (the newest 3), bit for bit.

``tests/distributed/test_chaos_soak.py`` runs a short seeded soak in the suite; the long one::

    python -m tests.distributed.chaos --interruptions 41 --seed 1 --workdir /tmp/soak
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from largebatch.engine.checkpoint import checkpoint_step, list_checkpoints, load_checkpoint
from tests.smoke import smoke

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch" / "torchrun.sh"
# 4 classes x 16 train images, batch 8 on 2 ranks: 8 steps an epoch; a checkpoint every step
# (the newest 3 kept, which both runs' last steps are compared by). timm's test_resnet (a ResNet
# with BN, 0.4M parameters): a step and its checkpoint cost a tenth of resnet10t's.
ARGS = smoke("backend=cpu", "data.loader=torchvision", "data.workers=1", "data.synthetic.train_per_class=16",
             "checkpoint.every_steps=1", "precision=fp32", "model=resnet10t", "model.name=test_resnet",
             "schedule=cosine", "schedule.warmup_epochs=0.5")
STEPS_PER_EPOCH = 8
STARTING_S = (0.5, 6.0)  # a moment while the launch starts: seconds after it (or its first checkpoint)
AT_STEP = (None, 1, 2, 3)  # None: while starting; else a fraction of a step after this many checkpoints
LATE_S = (0.0, 0.1)  # how long after that checkpoint: in the next step, its save or an evaluation


def epochs_for(interruptions: int) -> int:
    """Enough training that every interruption falls on a run still under way: a launch trains at
    most its moment's steps (3) and the few a tenth of a second adds (on a quiet machine), so about
    half an epoch per interruption, with one to spare."""
    return 1 + interruptions // 2
TARGETS = ("rank", "agent", "launcher", "group", "all")
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class Interruption:
    target: str
    signal: str
    at_step: Optional[int]  # None: while the launch starts; else after its at_step-th checkpoint
    after_s: float  # seconds after the launch (None) or after that checkpoint
    exit_code: Optional[int] = None
    survivors: list[str] = field(default_factory=list)


@dataclass
class SoakReport:
    interruptions: list[Interruption]
    launches: int
    compared_steps: int
    differing: list[str]

    def counts(self) -> dict[str, dict[str, int]]:
        """Interruptions by target and signal, and the exit codes the launcher gave."""
        return {
            "by_target": dict(Counter(i.target for i in self.interruptions)),
            "by_signal": dict(Counter(i.signal for i in self.interruptions)),
            "exit_codes": dict(Counter(str(i.exit_code) for i in self.interruptions)),
        }

    @property
    def survivors(self) -> list[str]:
        return [s for i in self.interruptions for s in i.survivors]


def _env() -> dict[str, str]:
    # the launch script's own torchrun (python3 -m largebatch.launch.torchrun), this environment's python
    env = {**os.environ, "NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1", "MAX_RESTARTS": "0",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    env.pop("TORCHRUN", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.pop("LB_DRY_RUN", None)
    return env


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _start_time(pid: int) -> Optional[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _is_rank(pid: int) -> bool:
    """A torchrun worker: its environment has the LOCAL_RANK torchrun sets (loader workers too,
    which inherit it: they are told apart by their parent, another rank)."""
    try:
        return b"\0LOCAL_RANK=" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def job_processes(launcher: int) -> dict[str, list[int]]:
    """The launch shell, the torchrun agent, the ranks and everything below, by role."""
    tree = _children()
    parent: dict[int, int] = {c: p for p, cs in tree.items() for c in cs}
    everyone: list[int] = []
    todo = [launcher]
    while todo:
        pid = todo.pop()
        everyone.append(pid)
        todo.extend(tree.get(pid, []))
    ranks = [p for p in everyone if _is_rank(p) and not _is_rank(parent.get(p, 0))]
    agents = sorted({parent[p] for p in ranks if p in parent})
    return {"launcher": [launcher], "agent": agents, "rank": ranks, "all": everyone}


def _interrupt(proc: subprocess.Popen, rng: random.Random, target: str, sig: signal.Signals) -> list[tuple[int, Optional[str]]]:
    """Send ``sig`` to ``target``; return every process of the job then (pid, start time)."""
    roles = job_processes(proc.pid)
    deadline = time.time() + 60
    while target in ("rank", "agent") and not roles[target] and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)  # the agent and its ranks appear a few seconds after the launch
        roles = job_processes(proc.pid)
    known = [(pid, _start_time(pid)) for pid in roles["all"]]
    if target == "group":
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        return known
    pids = roles[target]
    if target == "rank" and pids:
        pids = [rng.choice(pids)]
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return known


def _left(known: list[tuple[int, Optional[str]]], wait_s: float) -> list[str]:
    """The processes of ``known`` still alive after ``wait_s`` (a reused pid is not one)."""
    deadline = time.time() + wait_s
    while True:
        alive = [pid for pid, start in known if start is not None and _start_time(pid) == start
                 and not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"]
        if not alive or time.time() > deadline:
            return [f"{pid} {_cmdline(pid)[:120]}" for pid in alive]
        time.sleep(0.2)


def _default_signals() -> None:
    """As a terminal starts the launch: a suite run under nohup or in the background passes SIGHUP,
    SIGINT and SIGQUIT ignored to its children, and a shell that starts with a signal ignored
    cannot trap it (bash), so a SIGINT to the launcher was lost and the job trained on."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _newest_step(run: Path) -> int:
    found = list_checkpoints(run / "checkpoints")
    return checkpoint_step(found[-1]) if found else 0


def _moment(proc: subprocess.Popen, run: Path, event: Interruption, timeout_s: float = 300) -> bool:
    """Wait for ``event``'s moment; False where the launch ended first. While it starts: ``after_s``
    seconds, or until its first checkpoint if that comes sooner; else ``after_s`` after its
    ``at_step``-th checkpoint (polled every 10 ms, a fraction of a step)."""
    start = _newest_step(run)
    target, wait_s = (1, event.after_s) if event.at_step is None else (event.at_step, timeout_s)
    deadline = time.monotonic() + wait_s
    while _newest_step(run) < start + target and time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    if event.at_step is not None:
        if time.monotonic() >= deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"no checkpoint of step {start + target} within {timeout_s} s")
        time.sleep(event.after_s)
    return proc.poll() is None


def _launch(run: Path, resume: bool, log: Path, epochs: int) -> subprocess.Popen:
    args = [str(LAUNCH), *ARGS, f"epochs={epochs}", f"run_dir={run}", *(["resume=auto"] if resume else [])]
    return subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=log.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_default_signals)


def _finish(proc: subprocess.Popen, timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def uninterrupted(run: Path, log: Path, epochs: int) -> None:
    code = _finish(_launch(run, False, log, epochs), 900)
    assert code == 0, f"the reference run ended {code}: {log.read_text()[-3000:]}"


def soak(run: Path, interruptions: int, seed: int, log: Path, epochs: int) -> tuple[list[Interruption], int]:
    """Interrupt and resume the job ``interruptions`` times, then let it finish."""
    rng = random.Random(seed)
    done: list[Interruption] = []
    launches = 0
    while True:
        launches += 1
        proc = _launch(run, launches > 1, log, epochs)
        if len(done) == interruptions:
            code = _finish(proc, 900)
            assert code == 0, f"the last launch ended {code}: {log.read_text()[-3000:]}"
            return done, launches
        at_step = rng.choice(AT_STEP)
        event = Interruption(rng.choice(TARGETS), rng.choice(SIGNALS).name, at_step,
                             round(rng.uniform(*(STARTING_S if at_step is None else LATE_S)), 2))
        if _moment(proc, run, event):
            known = _interrupt(proc, rng, event.target, signal.Signals[event.signal])
            event.exit_code = _finish(proc, 300)
            # the launcher ended: nothing of the job may go on without it (one step and a
            # checkpoint of grace)
            event.survivors = _left(known, 20.0)
            for line in event.survivors:
                try:
                    os.kill(int(line.split()[0]), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            done.append(event)
            with log.open("a") as f:
                f.write(f"\n### chaos: {event}\n")
            continue
        # the job ended before the moment came: it finished (or failed on its own)
        proc.wait()
        assert proc.returncode == 0, f"a launch ended {proc.returncode} uninterrupted: {log.read_text()[-3000:]}"
        return done, launches


def compare(reference: Path, chaos: Path) -> tuple[int, list[str]]:
    """Steps whose checkpoints both runs hold, and those whose weights or optimizer differ."""
    ref = {p.name: p for p in list_checkpoints(reference / "checkpoints")}
    got = {p.name: p for p in list_checkpoints(chaos / "checkpoints")}
    common = sorted(set(ref) & set(got))
    differing = []
    for name in common:
        a, b = load_checkpoint(ref[name]), load_checkpoint(got[name])
        same = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        same = same and torch.equal(
            torch.cat([v.flatten() for s in a["optimizer"]["state"].values() for v in s.values() if torch.is_tensor(v)]),
            torch.cat([v.flatten() for s in b["optimizer"]["state"].values() for v in s.values() if torch.is_tensor(v)]))
        if not same:
            differing.append(name)
    return len(common), differing


def final_step(run: Path) -> int:
    return int(load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["step"])


def run_soak(workdir: Path, interruptions: int, seed: int) -> SoakReport:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "soak.log"
    reference, chaos = workdir / "reference", workdir / "chaos"
    epochs = epochs_for(interruptions)
    uninterrupted(reference, log, epochs)
    events, launches = soak(chaos, interruptions, seed, log, epochs)
    steps, differing = compare(reference, chaos)
    assert final_step(reference) == final_step(chaos) == epochs * STEPS_PER_EPOCH
    return SoakReport(events, launches, steps, differing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interruptions", type=int, default=41)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, required=True)
    a = parser.parse_args()
    report = run_soak(a.workdir, a.interruptions, a.seed)
    print(json.dumps({"interruptions": len(report.interruptions), "launches": report.launches,
                      "compared_steps": report.compared_steps, "differing": report.differing,
                      "survivors": report.survivors, **report.counts()}, indent=2))


if __name__ == "__main__":
    main()
