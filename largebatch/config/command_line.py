"""The command line of ``largebatch-train``: Hydra's flags, and which Hydra settings a run reads.

``largebatch-train`` parses its arguments with Hydra's own parser, so the flags are those of
any Hydra application: ``--cfg job|hydra|all`` (with ``--resolve``, ``--package``), ``--help``
(usage, flags, every config group and its options: ``conf/hydra/help/largebatch.yaml``),
``--hydra-help``, ``--info``, ``-m/--multirun``, before, between or after the overrides. Flags that pick another config tree
(``--config-path``, ``--config-name``, ``--config-dir``) are refused: the tree is ``conf/``.

Of Hydra's own settings, a single run reads ``hydra.run.dir`` (it is the run directory, as
``run_dir=``) and refuses the others, which it would ignore; a multirun reads them all
(``hydra.sweep.dir``, ``hydra/launcher``, ``hydra.launcher.*``, ...) and refuses one
``run_dir`` for all its jobs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from largebatch.errors import UsageError

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["multirun_overrides", "parse_command_line", "show", "single_run_overrides"]

_SWEEP_SETTINGS = ("hydra.sweep", "hydra/launcher", "hydra.launcher", "hydra/sweeper", "hydra.sweeper")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


# Hydra flags this command does not take (it has one config tree, conf/train.yaml).
_REFUSED_FLAGS = ("config_path", "config_name", "config_dir", "experimental_rerun", "shell_completion")


def parse_command_line(args: Sequence[str]) -> Any:
    """Hydra's own command line (``--cfg``, ``-m``, ``--help``, ...); a bad flag is a UsageError."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.prog = "largebatch-train"

    def error(message: str) -> None:
        raise UsageError(f"{message}; see largebatch-train --help")

    parser.error = error  # type: ignore[method-assign]
    # Intermixed: flags may stand anywhere, as in most commands ('debug=smoke -m seed=0,1');
    # Hydra's own parse_args takes them before the overrides only and calls the rest unrecognized.
    opts = parser.parse_intermixed_args(list(args))
    refused = [f"--{f.replace('_', '-')}" for f in _REFUSED_FLAGS if getattr(opts, f, None)]
    if refused:
        raise UsageError(f"largebatch-train does not take {refused[0]}: its config is conf/train.yaml "
                         f"plus overrides (key=value, group=option)")
    opts.parser = parser
    return opts


def single_run_overrides(overrides: Sequence[str]) -> list[str]:
    """A single run honours ``hydra.run.dir=X`` (as ``run_dir=X``) and refuses other Hydra settings."""
    out: list[str] = []
    run_dirs = [o for o in overrides if o.split("=", 1)[0].lstrip("+") in ("run_dir", "hydra.run.dir")]
    if len(run_dirs) > 1:
        raise UsageError(f"set the run directory once, not {' and '.join(run_dirs)}")
    for o in overrides:
        key = _key(o)
        if key == "hydra.run.dir":
            out.append("run_dir=" + o.split("=", 1)[1])
        elif key.startswith(("hydra.", "hydra/")):
            hint = " (add -m: it applies to multiruns)" if key.startswith(_SWEEP_SETTINGS) else ""
            raise UsageError(f"a single run does not use {key}{hint}; of Hydra's settings it reads hydra.run.dir (= run_dir)")
        else:
            out.append(o)
    return out


def _check_sweeps(overrides: Sequence[str]) -> None:
    """Each sweep runs at least one value: Hydra's sweeper raised a bare ValueError for
    ``range(0,2,0)`` (a traceback) and ran a sweep of no job, exit 0, for ``range(2,0)``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for line in overrides:
        try:
            override = parser.parse_override(line)
        except HydraException:
            continue  # composing says what is wrong with it, in one line (hydra_errors)
        if not (override.is_sweep_override() and override.is_discrete_sweep()) or isinstance(override.value(), Glob):
            continue  # a glob is matched against the group's options when the sweep is composed
        try:
            values = list(override.sweep_string_iterator())
        except ValueError as e:
            raise UsageError(f"{line}: {e}; a sweep is a list (a,b,c) or range(start, stop[, step]) "
                             "with a step other than 0") from None
        if not values:
            raise UsageError(f"{line} sweeps no value: range(start, stop[, step]) counts from start up to stop, "
                             "stop left out (a negative step counts down)")


def multirun_overrides(overrides: Sequence[str]) -> list[str]:
    """A multirun gives each job its own directory: refuse one directory for all of them; each
    sweep runs at least one value."""
    _check_sweeps(overrides)
    for o in overrides:
        key = _key(o)
        if key in ("run_dir", "hydra.run.dir"):
            raise UsageError(f"with -m each job runs in hydra.sweep.dir/<job number>; set hydra.sweep.dir=... "
                             f"instead of {key}")
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise UsageError("-m runs its jobs from one process; under torchrun start one torchrun per job, or "
                         "sweep with -m hydra/launcher=submitit_slurm hydra.launcher.tasks_per_node=N")
    return list(overrides)


def _show_cfg(hydra: Any, *, overrides: list[str], opts: Any, recipe: dict[str, Any]) -> None:
    """Hydra's ``show_cfg`` (hydra/_internal/hydra.py, 1.3), with ``recipe.derived`` and
    ``recipe.warnings`` as the run gets them: Hydra composes from the overrides alone, which
    leaves them empty (the run writes them after composing)."""
    import sys

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import Container, OmegaConf

    cfg = hydra.compose_config(config_name="train", overrides=overrides, run_mode=RunMode.RUN,
                               with_log_configuration=False)
    HydraConfig.instance().set_config(cfg)
    OmegaConf.set_readonly(cfg.hydra, None)
    cfg.recipe.derived = recipe["derived"]
    cfg.recipe.warnings = recipe["warnings"]
    cfg = hydra.get_sanitized_cfg(cfg, opts.cfg)
    package = None if opts.package == "_global_" else opts.package
    shown = cfg if package is None else OmegaConf.select(cfg, package)
    if shown is None:
        sys.stderr.write(f"package '{package}' not found in config\n")
        sys.exit(1)
    if not isinstance(shown, Container):
        print(shown)
        return
    if package is not None:
        print(f"# @package {package}")
    if opts.resolve:
        OmegaConf.resolve(shown)
    sys.stdout.write(OmegaConf.to_yaml(shown))


def _devices(cfg: DictConfig) -> list[str]:
    """On ImageNet (a recipe or a preset): the images per device, the BN batch and the memory a
    device needs, at the example world sizes (the run's is known only when it starts)."""
    from omegaconf import OmegaConf

    from largebatch.config.compose import to_train_config
    from largebatch.imagenet_recipe import device_lines

    if not OmegaConf.is_missing(cfg.data, "root") and cfg.data.root is None:
        return []  # the embedded data set: a CPU run, no cards
    tc = to_train_config(cfg)
    return device_lines(model=tc.model.name, optimizer=tc.optimizer.name, global_batch_size=tc.global_batch_size,
                        world_size=None, accumulation_steps=tc.accumulation_steps, bn_group_size=tc.bn.group_size,
                        precision=tc.precision.name, image_size=tc.data.image_size)


def show(opts: Any) -> None:
    """``--help``, ``--hydra-help``, ``--cfg``, ``--info``: Hydra's own output for conf/train.yaml (``--cfg``
    with the ImageNet recipe's ``recipe.derived`` and ``recipe.warnings`` filled in, :func:`_show_cfg`)."""
    import sys

    from largebatch.config import check_composed, check_overrides, compose_with_recipe, hydra_errors, hydra_session
    from largebatch.imagenet_recipe import describe

    overrides = list(opts.overrides)
    check_overrides(overrides)
    recorded: dict[str, Any] = {"derived": {}, "warnings": []}
    if opts.cfg or opts.info:
        job = [o for o in overrides if not _key(o).startswith(("hydra.", "hydra/"))]
        with hydra_errors(), hydra_session():
            cfg, recipe = compose_with_recipe(job)
        check_composed(cfg)
        # the ImageNet recipe's overrides go first, so that --cfg shows what a run composes; its
        # sources go to stderr, the config to stdout
        overrides = [*recipe, *overrides]
        recorded = {"derived": dict(cfg.recipe.derived), "warnings": list(cfg.recipe.warnings)}
        for line in [*describe(cfg.recipe.derived, cfg.global_batch_size, cfg.model.name), *_devices(cfg),
                     *cfg.recipe.warnings]:
            print(line, file=sys.stderr)
    with hydra_errors(), hydra_session() as hydra:
        if opts.help:
            hydra.app_help(config_name="train", args_parser=opts.parser, args=opts)
        elif opts.hydra_help:
            hydra.hydra_help(config_name="train", args_parser=opts.parser, args=opts)
        elif opts.cfg:
            _show_cfg(hydra, overrides=overrides, opts=opts, recipe=recorded)
        else:
            hydra.show_info(opts.info, config_name="train", overrides=overrides)
