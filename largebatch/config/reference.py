"""The configuration reference: every key of the schema in Markdown tables,
one table per group, for docs/config-reference.md.

The site's build writes the tables from the schema itself
(``scripts/mkdocs_config_reference.py`` calls :func:`reference_tables`), so
the page cannot drift from it. Each key's type and default come from the
dataclasses of :mod:`largebatch.config.schema`, its allowed values from its
Enum's choices, from :func:`largebatch.config.checks.value_ranges` or, for a
name looked up in a registry (``optimizer.name``), from its group's presets, and its
unit and meaning from the comment written beside the field, or directly
above it, in ``schema.py``. A unit is the comment's leading ``[...]``
(``bucket_mb: float = MISSING  # [MiB] DDP bucket size``).

``python -m largebatch.config.reference`` prints the tables.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from largebatch.config import schema
from largebatch.config.checks import value_ranges
from largebatch.config.pairs import PAIR_KEYS

__all__ = ["DefaultRunValue", "KeyDoc", "field_comments", "key_docs", "reference_tables", "yaml_settings"]

# the default cell of a key the schema leaves to the YAML files (MISSING)
SET_IN_YAML = "in YAML"
# after the default of a key a YAML file sets: the value is the default run's (conf/train.yaml's composition)
_FROM_YAML = "default run"
_TOP = "top level"
_UNIT = re.compile(r"^\[([^\[\]]+)\]\s*")  # "[MiB] ...", not a value's shape "[[epoch, x], ...]"
_HEADER = ("| key | type | default | unit | allowed values | meaning |\n"
           "|---|---|---|---|---|---|")


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    """One row of the reference: a leaf key of the schema."""

    key: str  # dotted: data.synthetic.classes
    group: str  # the key's first part, or "top level"
    type: str
    default: Any  # the schema's default (MISSING: the YAML sets it)
    unit: str
    allowed: str
    meaning: str


def field_comments(source: str) -> dict[tuple[str, str], str]:
    """(class, field) -> the comment of each field of each class in ``source``.

    A field's comment is the one ending its line, else the comment lines
    directly above it (no blank line between), joined into one line.
    """
    trailing: dict[int, str] = {}
    own_line: dict[int, str] = {}
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            text = tok.string.lstrip("#").strip()
            is_own = not lines[row - 1][: tok.start[1]].strip()
            (own_line if is_own else trailing)[row] = text
    out: dict[tuple[str, str], str] = {}
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)):
                continue
            rows = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
            text = " ".join(trailing[r] for r in rows if r in trailing)
            if not text:
                above, row = [], stmt.lineno - 1
                while row in own_line:
                    above.insert(0, own_line[row])
                    row -= 1
                text = " ".join(above)
            out[(cls.name, stmt.target.id)] = text
    return out


def _type_name(tp: Any) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_type_name(inner[0])} or null"
    if typing.get_origin(tp) is list:
        inner = _type_name(args[0])
        return f"list of {'lists' + inner[4:] if inner.startswith('list ') else inner + 's'}"
    if typing.get_origin(tp) is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if isinstance(tp, type) and issubclass(tp, Enum):
        return "choice"
    if tp is Any:  # a list whose items the checks read (e.g. schedule.points' [epoch, factor] pairs)
        return "value"
    names = {int: "integer", float: "number", bool: "boolean", str: "string"}
    return names[tp]


def _enum_of(tp: Any) -> type[Enum] | None:
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and issubclass(t, Enum):
            return t
    return None


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _conf() -> Path:
    """The config tree, the package ``largebatch.conf`` (``conf/`` of a checkout)."""
    import importlib.resources

    return Path(str(importlib.resources.files("largebatch.conf")))
# config groups whose files are packaged at the top level (``# @package _global_``)
_GLOBAL_GROUPS = ("experiment", "debug")


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return [prefix.rstrip(".")]
    return [k for name, value in node.items() for k in _leaves(value, f"{prefix}{name}.")]


def yaml_settings(conf: Path | None = None) -> dict[str, list[str]]:
    """Dotted key -> where ``conf/`` sets it, in the words a user types: ``train.yaml``,
    ``optimizer=lars``, ``experiment=mlperf_rn50``."""
    import yaml

    conf = conf or _conf()
    out: dict[str, list[str]] = {}
    files = [(conf / "train.yaml", "train.yaml", "")]
    files += [(f, f"{f.parent.name}={f.stem}", "" if f.parent.name in _GLOBAL_GROUPS else f"{f.parent.name}.")
              for f in sorted(conf.glob("*/*.yaml")) if f.parent.name != "hydra"]
    for path, where, prefix in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        data = {k: v for k, v in data.items() if k not in ("defaults", "hydra")}
        for key in _leaves(data, prefix):
            out.setdefault(key, []).append(where)
    return out


def _default_run() -> dict[str, Any]:
    """The embedded default run's composed values (``largebatch-train`` with no arguments)."""
    from omegaconf import OmegaConf

    from largebatch.config.compose import compose_config

    return OmegaConf.to_container(compose_config([]), resolve=True)  # type: ignore[return-value]


def _sentence(meaning: str, more: str) -> str:
    if not more:
        return meaning
    return f"{meaning}{'' if meaning.rstrip().endswith('.') else '.'} {more}" if meaning else more


def _set_by(where: list[str], recipe: bool) -> str:
    """``Set by train.yaml; optimizer= (sgd, lars); experiment= (4 of 7); the ImageNet recipe.``"""
    groups: dict[str, list[str]] = {}
    for w in where:
        group, _, option = w.partition("=")
        groups.setdefault(group, []).append(option)
    parts = []
    for group, options in groups.items():
        if not options[0]:
            parts.append(f"`conf/{group}`")
            continue
        total = len(list(_conf().glob(f"{group}/*.yaml")))
        named = ", ".join(options) if len(options) <= 3 else f"{len(options)} of {total}"
        parts.append(f"`{group}=` ({named})")
    if recipe:
        parts.append("the ImageNet recipe ([ImageNet at your batch size](imagenet.md))")
    return "Set by " + "; ".join(parts) + "." if parts else ""


def _registry_names() -> dict[str, str]:
    """Key -> the names a string key accepts where they are a registry's entries: the names its
    group's presets set (``conf/optimizer/*.yaml``, one per entry of ``largebatch.optim``'s
    registry, a test holds them equal; read here without importing torch, so the site builds
    without it)."""
    import yaml

    names = sorted(yaml.safe_load(f.read_text(encoding="utf-8"))["name"]
                   for f in _conf().glob("optimizer/*.yaml"))
    return {"optimizer.name": ", ".join(f"`{n}`" for n in names)}


def key_docs() -> list[KeyDoc]:
    """Every leaf key of ``TrainConfig``, in the schema's order.

    A key the schema leaves to the YAML files shows the default run's value, and every key
    says which files, group options and presets set it."""
    from largebatch.imagenet_recipe import FAMILIES

    comments = field_comments(Path(schema.__file__).read_text(encoding="utf-8"))
    settings = yaml_settings()
    run = _default_run()
    recipe_keys = {k for f in FAMILIES for k in (*f.common, *(k for p in f.points for k in p.values))}
    recipe_keys |= {"model.name", "optimizer.name", "schedule.name", "global_batch_size", "target_top1",
                    "base_batch_size"}
    ranges = value_ranges()
    names = _registry_names()
    docs: list[KeyDoc] = []

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp, key = hints[f.name], prefix + f.name
            if dataclasses.is_dataclass(tp):
                walk(tp, key + ".")
                continue
            note = comments.get((cls.__name__, f.name), "")
            unit = _UNIT.match(note)
            enum = _enum_of(tp)
            allowed = (", ".join(f"`{m.value}`" for m in enum) if enum
                       else ranges.get(key, "") or names.get(key, ""))
            default = _default(f)
            if default is MISSING:
                value: Any = run
                for part in key.split("."):
                    value = value[part]
                default = DefaultRunValue(value)
            meaning = note[unit.end():] if unit else note
            set_by = _set_by(settings.get(key, []), key in recipe_keys)
            docs.append(KeyDoc(
                key=key, group=key.split(".")[0] if "." in key else _TOP,
                type=f"list of pairs {PAIR_KEYS[key].types}" if key in PAIR_KEYS else _type_name(tp), default=default,
                unit=unit.group(1) if unit else "",
                allowed=allowed, meaning=_sentence(meaning, set_by)))

    walk(schema.TrainConfig, "")
    return docs


@dataclasses.dataclass(frozen=True)
class DefaultRunValue:
    """A key's value in the default run, where a YAML file (not the schema) sets it."""

    value: Any


def format_default(value: Any) -> str:
    """A default as YAML writes it, in a code span; a value from the YAML files is marked
    ``(YAML)``; MISSING (no value anywhere): ``SET_IN_YAML``."""
    if value is MISSING:
        return f"*{SET_IN_YAML}*"
    if isinstance(value, DefaultRunValue):
        return f"{format_default(value.value)} ({_FROM_YAML})"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, list):
        return "`[" + ", ".join(map(str, value)) + "]`"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _escape(text: str) -> str:
    """``text`` for a table cell: ``| * _`` escaped, code spans kept."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p.replace("|", "\\|") if p.startswith("`") else
                   re.sub(r"([|*_\\])", r"\\\1", p) for p in parts)


def _row(doc: KeyDoc) -> str:
    cells = (f"`{doc.key}`", doc.type, format_default(doc.default),
             _escape(doc.unit), _escape(doc.allowed), _escape(doc.meaning))
    return "| " + " | ".join(cells) + " |"


def _class_docs() -> dict[str, str]:
    """Group -> the first paragraph of its dataclass's docstring, if any."""
    tree = ast.parse(Path(schema.__file__).read_text(encoding="utf-8"))
    by_class = {c.name: ast.get_docstring(c) or "" for c in tree.body
                if isinstance(c, ast.ClassDef)}
    hints = typing.get_type_hints(schema.TrainConfig)
    return {f.name: " ".join(by_class[hints[f.name].__name__]
                             .split("\n\n")[0].split())
            for f in dataclasses.fields(schema.TrainConfig)
            if dataclasses.is_dataclass(hints[f.name])}


def reference_tables() -> str:
    """The reference's Markdown: a section per group, top-level keys first."""
    docs = key_docs()
    groups = [_TOP] + list(dict.fromkeys(d.group for d in docs
                                         if d.group != _TOP))
    intros = _class_docs()
    out = []
    for group in groups:
        title = "Top-level keys" if group == _TOP else f"`{group}`"
        out.append(f"## {title}\n")
        if intros.get(group):
            out.append(intros[group] + "\n")
        out.append(_HEADER)
        out.extend(_row(d) for d in docs if d.group == group)
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(reference_tables())
