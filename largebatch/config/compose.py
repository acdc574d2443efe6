"""Compose and validate the Hydra config; turn every config mistake into one clear message."""

from __future__ import annotations

import dataclasses
import difflib
import re
import shlex
from contextlib import contextmanager
from enum import Enum
from typing import Any, Iterable, Iterator, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from largebatch.config.checks import canonicalise_choices, check_ranges, check_sections
from largebatch.config.pairs import PAIR_KEYS, check_pair_list
from largebatch.config.schema import TrainConfig, register_schema
from largebatch.errors import ConfigError

__all__ = [
    "ConfigError", "check_composed", "check_overrides", "compose_config", "compose_with_recipe", "config_keys", "hydra_errors", "recipe_applies",
    "hydra_session", "to_train_config",
]

CONFIG_MODULE = "largebatch.conf"
GROUPS = ("model", "optimizer", "schedule", "data", "precision", "backend", "bn", "comm", "experiment", "debug")


def config_keys() -> list[str]:
    """Every dotted key of the schema (``optimizer.lr``, ``data.synthetic.classes``, ...)."""
    keys: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        for k in node.keys():
            v = node._get_node(k)
            full = f"{prefix}{k}"
            keys.append(full)
            if isinstance(v, DictConfig):
                walk(v, full + ".")

    walk(OmegaConf.structured(TrainConfig), "")
    return keys


def _quoted(key: str, value: str) -> str | None:
    """``key="value"`` quoted for Hydra's grammar and then for the shell; None if Hydra would not read ``value`` back."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if '"' not in value:
        override = f'{key}="{value}"'
    elif "'" not in value:
        override = f"{key}='{value}'"
    else:
        override = key + '="' + value.replace('"', '\\"') + '"'
    try:
        if OverridesParser.create().parse_override(override).value() != value:
            return None
    except HydraException:
        return None
    return shlex.quote(override)


def _check_grammar(override: str) -> None:
    """Hydra's override grammar accepts ``override``, or the error says how to quote its value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        OverridesParser.create().parse_override(override)
    except HydraException as e:
        key, value = override.split("=", 1)
        quoted = _quoted(key, value)
        hint = f"; quote the value, for Hydra and for the shell: {quoted}" if quoted else ""
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]  # "token recognition error at: 'ü'"
        raise ConfigError(f"Hydra cannot parse the override {override!r} ({reason}){hint}") from None


def check_overrides(overrides: Iterable[str]) -> None:
    """Every override parses, and names a schema key, a config group or a Hydra setting (else: the closest key).

    A value Hydra's grammar rejects (``run_dir=/tmp/ü n i``), or one the shell split at its
    spaces (``run_dir=/tmp/ü``, ``n``, ``i``), gets the quoted form that works.
    """
    overrides = list(overrides)
    known = set(config_keys())
    for i, o in enumerate(overrides):  # first: a value the shell split reads best as a whole
        if _is_stray_word(o):
            raise ConfigError(f"override {o!r} is not of the form key=value{_split_hint(overrides, i)}")
    for o in overrides:
        if o.startswith("~") and o[1:].split("=")[0] in GROUPS:
            continue  # Hydra's deletion of a defaults entry, e.g. ~experiment
        _check_grammar(o)
        key = o.split("=", 1)[0].strip()
        key = key.lstrip("+~")
        if key.startswith(("hydra.", "hydra/")) or key.split("@")[0] in GROUPS:
            continue
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown config key '{key}'{hint}; see conf/ and largebatch/config/schema.py")


def _is_stray_word(override: str) -> bool:
    """Neither ``key=value`` nor the deletion of a defaults entry (``~experiment``)."""
    return "=" not in override and not (override.startswith("~") and override[1:] in GROUPS)


def _split_hint(overrides: Sequence[str], i: int) -> str:
    """For words without ``=`` right after a ``key=value``: the shell split a value; quote it whole."""
    start = i
    while start > 0 and _is_stray_word(overrides[start - 1]):
        start -= 1
    if start == 0 or "=" not in overrides[start - 1]:
        return ""
    end = i
    while end + 1 < len(overrides) and _is_stray_word(overrides[end + 1]):
        end += 1
    key, value = overrides[start - 1].split("=", 1)
    quoted = _quoted(key, " ".join([value, *overrides[start:end + 1]]))
    return f"; if the shell split a value at its spaces, quote it whole: {quoted}" if quoted else ""


# OmegaConf's type errors, as "key=value is not ...; set key= to ..." (what to do, not only what
# went wrong). Its messages name the value and the type; full_key names the key.
_TYPE_NAMES = {"Float": ("a number", "numbers"), "Integer": ("an integer", "integers"), "String": ("a string", "strings")}


def _set_to(key: str, type_name: str) -> str:
    """``set key= to <type>``; an item of a list (``data.crop_scale[0]``) is set as the whole list."""
    one, many = _TYPE_NAMES[type_name]
    if "[" in key:
        return f"set {key.split('[')[0]}= to a list of {many}"
    return f"set {key}= to {one}"


_OMEGACONF_TYPE_ERRORS: tuple[tuple[str, Any], ...] = (
    (r"Value '(?P<v>.*)' of type '\w+' could not be converted to (?P<t>Float|Integer|String)$",
     lambda k, m: f"{k}={m['v']} is not {_TYPE_NAMES[m['t']][0]}; {_set_to(k, m['t'])}"),
    (r"Cannot convert '(?P<t>\w+)' to string: '(?P<v>.*)'$",
     lambda k, m: f"{k}={m['v']} is a {m['t']}, not a string; set {k}= to one value"),
    (r"Value '(?P<v>.*)' is not a valid bool",
     lambda k, m: f"{k}={m['v']} is not true or false; set {k}=true or {k}=false"),
    (r"Invalid value '(?P<v>.*)', expected one of \[(?P<o>.*)\]$",
     lambda k, m: f"{k}={m['v']}: expected one of [{m['o']}]; set {k}= to one of them"),
    (r"Invalid value assigned: (?P<t>\w+) is not a ListConfig, list or tuple",
     lambda k, m: f"{k} is a list, not a {m['t']}; write it in brackets, e.g. {k}=[x,y]"),
)


def _first_line(e: BaseException) -> str:
    # The wrapped error says most (Hydra wraps OmegaConf's), but a __context__ can be OmegaConf's
    # unformatted template ("Value '$VALUE' of type '$VALUE_TYPE' ..."): skip those.
    messages = [str(x).strip() for x in (e.__cause__, e.__context__, e) if x is not None and str(x).strip()]
    msg = next((m for m in messages if "$VALUE" not in m and "$KEY" not in m), messages[-1] if messages else "")
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    key = next((ln for ln in lines if ln.startswith("full_key:")), "")
    head = lines[0] if lines else type(e).__name__
    name = key.removeprefix("full_key:").strip()
    if name:
        for pattern, say in _OMEGACONF_TYPE_ERRORS:
            m = re.match(pattern, head)
            if m:
                return say(name, m)
    missing = re.match(r"Interpolation key '(.*)' not found$", head)
    if missing:
        return (f"${{{missing.group(1)}}} names no config key; write one the config has "
                f"(largebatch-train --cfg job shows them) or leave the $ out")
    env = re.match(r"\"?Environment variable '(.*)' not found\"?$", head)
    if env:
        return (f"environment variable {env.group(1)} (in ${{oc.env:{env.group(1)}}}) is not set; set it, or give "
                f"a default: ${{oc.env:{env.group(1)},<default>}}")
    return f"{head} ({key})" if key and key not in head else head


def _check_pair_value(e: BaseException) -> None:
    """A list-of-pairs key given no list (``data.resolution.crop_scale_steps=0.5``): OmegaConf's
    merge refuses it; :func:`check_pair_list` says so with the form to write, from the value."""
    for x in (e, e.__cause__, e.__context__):
        key = str(getattr(x, "full_key", None))
        if key in PAIR_KEYS:
            check_pair_list(key, getattr(x, "value", None))


@contextmanager
def hydra_errors() -> Iterator[None]:
    """Turn Hydra's and OmegaConf's composition errors into one-line ``ConfigError``s."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as e:
        _check_pair_value(e)
        msg = _first_line(e)
        sweep = re.match(r"Ambiguous value for argument '([^=']+)=(.*)'$", msg)
        if sweep:  # Hydra's own fix is on the lines after the first: say it in the one line
            key, value = sweep.groups()
            raise ConfigError(f"{key}={value} lists several values, which sweeps them: add -m to run a job for "
                              f"each (largebatch-train -m ... {key}={value}); a list value is written in "
                              f"brackets ({key}=[{value}])") from None
        m = re.search(r"Could not find '([^']+)'", msg)
        if m and m.group(1).startswith("hydra/launcher/submitit"):
            raise ConfigError(f"{m.group(1).split('/')[-1]} needs Hydra's submitit launcher: "
                              f"pip install '/path/to/largebatch[slurm]' (your clone; hydra-submitit-launcher)") from None
        if m:
            group = m.group(1).split("/")[0]
            text = str(e)
            options = re.findall(r"^\t(\S+)$", text.split("Config search path")[0], flags=re.M)
            listed = f"; choose one of: {', '.join(options)}" if options else ""
            raise ConfigError(f"no config '{m.group(1)}' in conf/{group}/{listed}") from None
        raise ConfigError(msg) from None


@contextmanager
def hydra_session(job_name: str = "largebatch-train") -> Iterator[Any]:
    """Hydra initialised on ``conf/`` (the package ``largebatch.conf``); yields its ``Hydra`` object.

    The object runs Hydra's own ``--cfg``, ``--help`` and multirun (sweeper + launcher).
    """
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, job_name=job_name, version_base="1.3"):
        yield GlobalHydra.instance().hydra


def check_composed(cfg: DictConfig) -> DictConfig:
    """Resolve interpolations in place, require every ``???`` value to be set, check value
    ranges, write aliased choices in their canonical form and check the sections whose keys go
    together on the typed config (:mod:`largebatch.config.checks`)."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.resolve(cfg)
        missing = sorted(OmegaConf.missing_keys(cfg))
    except OmegaConfBaseException as e:
        raise ConfigError(_first_line(e)) from None
    if missing:
        raise ConfigError(f"config value(s) {', '.join(missing)} must be set, e.g. {missing[0]}=...")
    check_ranges(cfg)
    canonicalise_choices(cfg)
    check_sections(to_train_config(cfg))
    return cfg


def compose_config(overrides: Sequence[str] = (), config_name: str = "train") -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` with command-line ``overrides``, typed by the schema;
    on ImageNet without a preset, with the published recipe for the batch (:func:`compose_with_recipe`)."""
    check_overrides(overrides)
    with hydra_errors(), hydra_session():
        cfg, _ = compose_with_recipe(list(overrides), config_name)
    return check_composed(cfg)


def _written(overrides: Sequence[str]) -> list[str]:
    """The keys and groups the command line sets (``optimizer.lr``, ``optimizer``, ...)."""
    return [o.split("=", 1)[0].strip().lstrip("+~") for o in overrides if "=" in o]


def recipe_applies(cfg: DictConfig, choices: Any) -> bool:
    """The ImageNet recipe is derived for ``data=imagenet`` without an experiment preset, unless ``recipe.mode=off``."""
    return cfg.recipe.mode == "auto" and choices.get("data") == "imagenet" and choices.get("experiment") in (None, "null")


def compose_with_recipe(overrides: list[str], config_name: str = "train") -> tuple[DictConfig, list[str]]:
    """Compose in an initialised Hydra; with ``data=imagenet``, no ``experiment`` and
    ``recipe.mode=auto``, compose again with the recipe's overrides before the user's (so every
    key the user set wins) and record each derived value's source in ``recipe.derived``.

    Returns the config and the recipe's overrides ([] where no recipe applies).
    """
    from hydra import compose
    from omegaconf import open_dict

    from largebatch.imagenet_recipe import DEFAULT_MODEL, UserLr, derive

    cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    if not recipe_applies(cfg, choices):
        return cfg, []
    written = _written(overrides)

    def chosen(group: str) -> Optional[str]:
        return cfg[group].name if group in written or f"{group}.name" in written else None

    model = chosen("model")
    # the user's own lr rule, as composed: the recipe says what peak it becomes (or refuses it)
    user_lr = (UserLr(lr=cfg.optimizer.lr, base_batch_size=cfg.base_batch_size, lr_scaling=cfg.lr_scaling.value)
               if "optimizer.lr" in written else None)
    recipe = derive(model=model or DEFAULT_MODEL, optimizer=chosen("optimizer"), schedule=chosen("schedule"),
                    global_batch_size=cfg.global_batch_size if "global_batch_size" in written else None,
                    written=written, user_lr=user_lr)
    if model is None:
        recipe.overrides.insert(0, f"model={DEFAULT_MODEL}")
        recipe.sources = {"model": f"{DEFAULT_MODEL}: chosen: the model of Goyal et al., MLPerf and the records",
                          **recipe.sources}
    cfg = compose(config_name=config_name, overrides=[*recipe.overrides, *overrides])
    cfg.recipe.derived = recipe.sources
    cfg.recipe.warnings = recipe.warnings
    return cfg, recipe.overrides


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """The composed config as plain dataclasses, each choice as its plain string.

    The schema types choices as Enums, so a wrong choice fails at compose time naming the
    valid ones; past that point they are turned into their values here, once, so that the
    library receives ``"cosine"``, never ``ScheduleName.cosine``.
    """
    out = OmegaConf.to_object(cfg)
    _enums_to_values(out)
    return out  # type: ignore[return-value]


def _enums_to_values(node: Any) -> None:
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, Enum):
            setattr(node, f.name, value.value)
        elif dataclasses.is_dataclass(value):
            _enums_to_values(value)
