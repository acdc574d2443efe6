"""docs/config-reference.md lists every key of the schema with the schema's
own default: its tables are written at build time (by the hook
scripts/mkdocs_config_reference.py) by largebatch.config.reference, the
generator these tests call."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import typing
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from omegaconf import MISSING, OmegaConf

from largebatch.config import compose_config, config_keys
from largebatch.config.checks import value_ranges
from largebatch.config.reference import (
    field_comments,
    key_docs,
    reference_tables,
)
from largebatch.config.schema import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUN = compose_config([])  # largebatch-train with no arguments
# | `key` | type | default | the other cells |
ROW = re.compile(r"^\| `([\w.]+)` \| ([^|]+) \| ([^|]+) \|(.*)\|$",
                 re.MULTILINE)


def _schema_defaults() -> dict[str, Any]:
    """Dotted leaf key -> default, from the dataclasses (MISSING kept)."""
    out: dict[str, Any] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{prefix}{f.name}.")
            elif f.default_factory is not dataclasses.MISSING:
                out[prefix + f.name] = f.default_factory()
            else:
                out[prefix + f.name] = f.default

    walk(TrainConfig, "")
    return out


def _rows() -> dict[str, tuple[str, str, str]]:
    rows = ROW.findall(reference_tables())
    keys = [r[0] for r in rows]
    assert len(keys) == len(set(keys)), "a key is listed twice"
    return {r[0]: (r[1].strip(), r[2].strip(), r[3]) for r in rows}


def test_every_schema_key_is_on_the_page() -> None:
    defaults = _schema_defaults()
    assert set(_rows()) == set(defaults)
    # the same keys as the override check knows (less the group nodes)
    parts = [k.split(".") for k in defaults]
    nodes = {".".join(p[:i]) for p in parts for i in range(1, len(p))}
    assert set(config_keys()) - nodes == set(defaults)


def test_every_default_shown_is_the_schema_default() -> None:
    rows = _rows()
    for key, default in _schema_defaults().items():
        shown = rows[key][1]
        if default is MISSING:  # a YAML file sets it: the default run's value (issue 73)
            value = OmegaConf.select(DEFAULT_RUN, key)
            value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            assert shown.endswith(" (default run)"), (key, shown)
            assert yaml.safe_load(shown.removesuffix(" (default run)").strip("`")) == getattr(value, "value", value), key
            continue
        assert shown.startswith("`") and shown.endswith("`"), (key, shown)
        if isinstance(default, Enum):
            default = default.value
        assert yaml.safe_load(shown.strip("`")) == default, (key, shown)


def test_every_key_has_a_meaning_and_its_checks() -> None:
    docs = {d.key: d for d in key_docs()}
    assert not [k for k, d in docs.items() if not d.meaning.strip()]
    for key, must in value_ranges().items():
        assert docs[key].allowed == must, key
    assert docs["lr_scaling"].allowed == "`linear`, `sqrt`, `none`"
    assert docs["comm.bucket_mb"].unit == "MiB"
    assert not docs["comm.bucket_mb"].meaning.startswith("[")
    assert docs["target_top1"].type == "number or null"
    assert docs["optimizer.betas"].type == "list of numbers or null"
    # a value's shape is not a unit; a list of lists reads as one (issue 73)
    assert docs["data.resolution.crop_scale_steps"].unit == "" and docs["batch_schedule.steps"].unit == ""
    assert docs["data.resolution.crop_scale_steps"].meaning.startswith("[[epoch, min_scale], ...]")
    assert docs["data.resolution.steps"].type == "list of pairs of integers"
    # the schema types the list-of-pairs keys as lists of anything (config.pairs checks each item)
    assert docs["schedule.points"].type == "list of pairs of numbers"
    # where a value comes from: the files, group options and presets that set it
    assert "`optimizer=` (4 of 4)" in docs["optimizer.lr"].meaning and "the ImageNet recipe" in docs["epochs"].meaning
    assert "checks.py" not in " ".join(d.meaning for d in docs.values())


def test_a_field_comment_is_its_line_or_the_block_above() -> None:
    source = (
        "class C:\n"
        "    a: int = 1  # [s] trailing\n"
        "    # above, first line\n"
        "    # second line\n"
        "    b: int = 2\n"
        "    # a note on the group\n"
        "\n"
        "    c: int = 3\n"
    )
    assert field_comments(source) == {
        ("C", "a"): "[s] trailing",
        ("C", "b"): "above, first line second line",
        ("C", "c"): "",
    }


def test_the_hook_writes_the_tables_into_the_page() -> None:
    spec = importlib.util.spec_from_file_location(
        "mkdocs_config_reference",
        ROOT / "scripts" / "mkdocs_config_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)  # type: ignore[union-attr]
    text = (ROOT / "docs" / hook.PAGE).read_text(encoding="utf-8")
    page = SimpleNamespace(file=SimpleNamespace(src_uri=hook.PAGE))
    built = hook.on_page_markdown(text, page=page)
    assert hook.MARKER not in built and reference_tables() in built
    other = SimpleNamespace(file=SimpleNamespace(src_uri="api.md"))
    assert hook.on_page_markdown(text, page=other) == text
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "scripts/mkdocs_config_reference.py" in mkdocs
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    assert "config-reference.md" in configuration


def test_train_yaml_writes_no_value_the_schema_also_writes() -> None:
    """One source per value: a key conf/train.yaml sets has no schema
    default (tests/test_config.py: the schema's defaults are the run's)."""
    def leaves(node: dict, prefix: str = "") -> list[str]:
        return [k for key, v in node.items() for k in (
            leaves(v, f"{prefix}{key}.") if isinstance(v, dict)
            else [f"{prefix}{key}"])]

    text = yaml.safe_load((ROOT / "conf" / "train.yaml").read_text())
    written = [k for k in leaves(text)
               if not k.startswith(("defaults", "hydra."))]
    defaults = _schema_defaults()
    assert written and all(k in defaults for k in written), written
    assert [k for k in written if defaults[k] is not MISSING] == []


def test_the_loop_defaults_are_the_schema_defaults() -> None:
    """StepSettings (for callers without a config) defaults as the schema."""
    from largebatch.engine.loop import StepSettings

    defaults = _schema_defaults()
    loop = {f.name: f.default for f in dataclasses.fields(StepSettings)}
    for key in ("accumulation_steps", "log_every", "max_skipped_steps",
                "non_finite"):
        schema_default = defaults[key]
        if isinstance(schema_default, Enum):
            schema_default = schema_default.value
        assert loop[key] == schema_default, key


def _parameter_defaults(fn: Any) -> dict[str, Any]:
    parameters = inspect.signature(fn).parameters.items()
    return {name: p.default for name, p in parameters
            if p.default is not inspect.Parameter.empty}


def test_library_defaults_agree_with_the_schema() -> None:
    """The reusable parts keep their own defaults (callable without a config:
    timm's EMA, the lr schedules, the noise-scale hook); where a schema key
    names the same setting, the two defaults are equal."""
    from largebatch.engine.ema import EmaSettings, build_model_ema
    from largebatch.engine.noise_scale_hook import NoiseScaleHook
    from largebatch.lr.schedules import (
        build_lr_scheduler,
        lr_multiplier,
        schedule_factors,
    )

    defaults = _schema_defaults()
    pairs = [("diagnostics.noise_scale.beta",
              _parameter_defaults(NoiseScaleHook)["beta"])]
    ema = {f.name: f.default for f in dataclasses.fields(EmaSettings)}
    pairs += [(f"ema.{k}", v) for k, v in ema.items()]
    pairs += [(f"ema.{k}", v)
              for k, v in _parameter_defaults(build_model_ema).items()]
    for fn in (build_lr_scheduler, lr_multiplier, schedule_factors):
        pairs += [(f"schedule.{k}", v)
                  for k, v in _parameter_defaults(fn).items()
                  if f"schedule.{k}" in defaults
                  and defaults[f"schedule.{k}"] is not MISSING]
    assert {"ema.decay", "ema.every", "schedule.gamma", "schedule.end_lr",
            "schedule.warmup_start"} <= {key for key, _ in pairs}
    for key, value in pairs:
        schema_default = defaults[key]
        if isinstance(schema_default, Enum):
            schema_default = schema_default.value
        if isinstance(value, tuple):
            value = list(value)
        assert value == pytest.approx(schema_default), key


def test_every_row_reads_for_a_user() -> None:
    """The generator's slips a reader saw on the page stay fixed (issue 73): a value's shape
    read as a unit, a doubled plural, a source file in a meaning, a key showing no value."""
    from largebatch.optim import optimizer_names

    docs = key_docs()
    for d in docs:
        assert "[" not in d.unit and "]" not in d.unit, (d.key, d.unit)
        assert "ss " not in f"{d.type} ", (d.key, d.type)
        assert not re.search(r"\w\.py\b", d.meaning), (d.key, d.meaning)
    rows = _rows()
    for key, (_, shown, _) in rows.items():
        # a value (a code span, the default run's marked as such), never a placeholder
        assert re.fullmatch(r"`[^`]*`( \(default run\))?", shown), (key, shown)
    assert "in YAML" not in reference_tables()
    # a key the schema leaves to the YAML files shows the default run's value and names what sets it
    for d in docs:
        if type(d.default).__name__ == "DefaultRunValue":
            assert "Set by " in d.meaning, d.key
    # a name looked up in the optimizer registry lists the names the registry takes (the
    # reference reads them from the presets, one per entry, named as the entry)
    names = optimizer_names()
    assert {d.key: d for d in docs}["optimizer.name"].allowed == ", ".join(f"`{n}`" for n in names)
    presets = {p.stem: yaml.safe_load(p.read_text())["name"] for p in (ROOT / "conf" / "optimizer").glob("*.yaml")}
    assert sorted(presets) == names and all(k == v for k, v in presets.items()), presets
    # a meaning ending in a parenthesis still ends its sentence before "Set by"
    assert "(presets: conf/model/). Set by" in {d.key: d for d in docs}["model.name"].meaning
