"""Turn an experiment YAML file plus ``a.b=c`` overrides into a validated ``ExperimentConfig``.

This module owns every check that can be made before anything runs: YAML syntax, unknown keys (with a
"did you mean" hint), value types, ``Literal`` choices, the numeric bounds and path-existence flags kept in
the schema's field metadata (``rayfl.config.bounded``), the variant tables of tagged sections (``model``,
``algorithm``), and then the rules that span fields (kept in ``rayfl.experiment.rules``, run by
``validate_semantics``). Each failure is a ``ConfigError`` that names the key path, the file and the line the value
came from (or the override that set it).

It also writes configs back (``config_to_dict``, ``dump_config``) in a form that ``load_config`` reads to an
equal config. Like ``rayfl.config`` it imports neither torch nor Ray.

Relative path values are resolved against the YAML file's directory when they come from the file, and
against the current working directory when they come from an override (or when there is no file); the
config keeps the resolved absolute path.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from rayfl.config.model import CustomModelConfig
from rayfl.core.errors import ConfigError, KeyPath
from rayfl.experiment.rules import (
    DATA_INPUTS,
    MAX_SHARDS,
    MODEL_INPUTS,
    clients_per_round_problem,
    model_input_problem,
    output_dir_problem,
    run_name_problem,
    semantic_problems,
    trace_problems,
)
from rayfl.experiment.schema import ExperimentConfig

__all__ = [
    "DATA_INPUTS",
    "MAX_SHARDS",
    "MODEL_INPUTS",
    "ConfigError",
    "KeyPath",
    "YamlSource",
    "check_clients_per_round",
    "check_factories",
    "check_model_input",
    "check_output_dir",
    "config_to_dict",
    "dump_config",
    "experiment_config",
    "format_key_path",
    "load_config",
    "locate_error",
    "run_name_problem",
    "validate_semantics",
]

# Where a value came from: a 1-based line of the file, or the text of the override that set it.
Origin = int | str

_MERGE_TAG = "tag:yaml.org,2002:merge"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_FLOAT_TAG = "tag:yaml.org,2002:float"


# ------------------------------------------------------------------------------------------------- YAML
class _Loader(yaml.SafeLoader):
    """``SafeLoader`` that also reads ``1e-3`` and ``1e3`` as floats (PyYAML's YAML 1.1 rule wants a dot)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _FLOAT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)


class _Dumper(yaml.SafeDumper):
    """``SafeDumper`` that quotes any string ``_Loader`` would read as something else (e.g. ``'1e5'``)."""


_Dumper.yaml_implicit_resolvers = {k: list(v) for k, v in _Loader.yaml_implicit_resolvers.items()}


def _yaml_error(err: yaml.YAMLError, file: str | None, override: str | None = None) -> ConfigError:
    line: int | None = None
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        if mark is not None:
            line = mark.line + 1
        context = err.context
        if context and err.context_mark is not None and err.context_mark is not mark:
            context += f" (from line {err.context_mark.line + 1})"
        parts = [p for p in (context, err.problem) if p]
        text = ", ".join(parts) if parts else str(err)
    else:
        text = str(err)
    return ConfigError(f"invalid YAML: {text}", file=file, line=None if override else line, override=override)


def _parse_yaml(text: str, file: str) -> tuple[Any, dict[KeyPath, int]]:
    """The document's value (plain dicts, lists, scalars) and the 1-based line of every key path."""
    loader = _Loader(text)
    lines: dict[KeyPath, int] = {}
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, lines
        lines[()] = node.start_mark.line + 1
        return _node_value(loader, node, (), lines, file, set()), lines
    except yaml.YAMLError as err:
        raise _yaml_error(err, file) from err
    finally:
        loader.dispose()


def _node_value(
    loader: _Loader, node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], file: str, active: set[int]
) -> Any:
    if id(node) in active:
        raise ConfigError("recursive YAML alias", _format_path(path), file=file, line=node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode) and node.tag == _MAP_TAG:
        active.add(id(node))
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = _scalar_key(loader, key_node, path, file)
            if key in seen:
                raise ConfigError(
                    "duplicate key",
                    _format_path((*path, str(key))),
                    file=file,
                    line=key_node.start_mark.line + 1,
                )
            seen.add(key)
        loader.flatten_mapping(node)  # resolves '<<' merge keys; later entries win, as in PyYAML
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar_key(loader, key_node, path, file)
            child = (*path, key if isinstance(key, str) else str(key))
            lines[child] = key_node.start_mark.line + 1
            mapping[key] = _node_value(loader, value_node, child, lines, file, active)
        active.discard(id(node))
        return mapping
    if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ_TAG:
        active.add(id(node))
        items: list[Any] = []
        for index, item_node in enumerate(node.value):
            child = (*path, index)
            lines[child] = item_node.start_mark.line + 1
            items.append(_node_value(loader, item_node, child, lines, file, active))
        active.discard(id(node))
        return items
    return loader.construct_object(node, deep=True)


def _scalar_key(loader: _Loader, key_node: yaml.Node, path: KeyPath, file: str) -> Any:
    if not isinstance(key_node, yaml.ScalarNode):
        raise ConfigError(
            "mapping keys must be plain names",
            _format_path(path),
            file=file,
            line=key_node.start_mark.line + 1,
        )
    return loader.construct_object(key_node)


# ------------------------------------------------------------------------------------------------- context
def format_key_path(path: KeyPath) -> str:
    """``("a", "b", 0)`` as ``a.b[0]``, the form errors name keys in."""
    return _format_path(path)


def _format_path(path: KeyPath) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


@dataclasses.dataclass
class _Context:
    """What errors and path checks need: the file, its directory and where each value came from."""

    file: str | None
    base_dir: Path
    origins: dict[KeyPath, Origin]
    override_dir: Path | None = None  # where relative paths set by overrides resolve; None = the working directory

    def origin(self, path: KeyPath) -> Origin | None:
        for end in range(len(path), -1, -1):
            found = self.origins.get(path[:end])
            if found is not None:
                return found
        return None

    def error(self, path: KeyPath, reason: str) -> ConfigError:
        origin = self.origin(path)
        if isinstance(origin, str):
            return ConfigError(reason, _format_path(path), file=self.file, override=origin)
        return ConfigError(reason, _format_path(path), file=self.file, line=origin)

    def base_for(self, path: KeyPath) -> Path:
        if isinstance(self.origin(path), str):
            return self.override_dir if self.override_dir is not None else Path.cwd()
        return self.base_dir


# ------------------------------------------------------------------------------------------------- schema
_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    """The resolved field types of a dataclass (its annotations are strings), cached per class."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _fields(cls: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _default_variant(f: dataclasses.Field[Any]) -> str:
    default = _default_of(f)
    return str(getattr(default, "name", ""))


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"bool {str(value).lower()}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return f"a list {list(value)!r}"
    return f"{type(value).__name__} {value!r}"


def _expected(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is bool:
        return "a boolean (true/false)"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        plural = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}
        if not args:
            return "a list"
        return f"a list of {plural.get(args[0], f'values ({_expected(args[0])})')}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping (section)"
    if origin in (Union, types.UnionType):
        return " or ".join(_expected(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return str(tp)


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    return "valid keys: " + ", ".join(choices)


# ------------------------------------------------------------------------------------------------- building
def _build(cls: type[Any], raw: Any, path: KeyPath, ctx: _Context, variant_of: str = "") -> Any:
    """Instantiate dataclass ``cls`` from mapping ``raw``, checking every key and value."""
    if not isinstance(raw, Mapping):
        raise ctx.error(path, f"expected a mapping (section), got {_describe(raw)}")
    fields = _fields(cls)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise ctx.error((*path, str(key)), f"keys must be strings, got {_describe(key)}")
        child = (*path, key)
        f = fields.get(key)
        if f is None:
            raise ctx.error(child, _unknown_key_reason(key, list(fields), path, variant_of))
        kwargs[key] = _field_value(f, hints[key], value, child, ctx)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:  # a dataclass __post_init__ may refuse a combination
        raise ctx.error(path, str(err)) from err


def _unknown_key_reason(key: str, valid: list[str], path: KeyPath, variant_of: str) -> str:
    where = f"'{_format_path(path)}'" if path else "the top level"
    reason = f"unknown key '{key}' in {where}; {_suggest(key, valid)}"
    if variant_of:
        owners = [
            name for name, other in _tagged_table_at(path).items() if name != variant_of and key in _fields(other)
        ]
        if owners:
            reason += f" ('{key}' belongs to {', '.join(repr(o) for o in owners)}; set {_format_path(path)}.name)"
    return reason


def _tagged_table_at(path: KeyPath) -> dict[str, type[Any]]:
    """The variant table if ``path`` names a tagged section (reached via plain sections), else ``{}``."""
    cls: type[Any] = ExperimentConfig
    for depth, part in enumerate(path):
        f = _fields(cls).get(str(part))
        if f is None:
            return {}
        table: Mapping[str, type[Any]] | None = f.metadata.get("tagged")
        if table is not None:
            return dict(table) if depth == len(path) - 1 else {}
        hint = _hints(cls)[f.name]
        if not (dataclasses.is_dataclass(hint) and isinstance(hint, type)):
            return {}
        cls = hint
    return {}


def _field_value(f: dataclasses.Field[Any], hint: Any, value: Any, path: KeyPath, ctx: _Context) -> Any:
    table: Mapping[str, type[Any]] | None = f.metadata.get("tagged")
    if table is not None:
        return _build_tagged(f, table, value, path, ctx)
    result = _convert(value, hint, path, ctx)
    _check_bounds(f, result, path, ctx)
    if isinstance(result, str) and "path" in f.metadata:
        result = _check_path(result, f.metadata["path"], path, ctx)
    return result


def _build_tagged(
    f: dataclasses.Field[Any], table: Mapping[str, type[Any]], value: Any, path: KeyPath, ctx: _Context
) -> Any:
    if not isinstance(value, Mapping):
        raise ctx.error(path, f"expected a mapping (section), got {_describe(value)}")
    name = value.get("name", _default_variant(f))
    known = ", ".join(repr(k) for k in table)
    if not isinstance(name, str):
        raise ctx.error((*path, "name"), f"expected one of {known}, got {_describe(name)}")
    variant = table.get(name)
    if variant is None:
        close = difflib.get_close_matches(name, list(table), n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ctx.error((*path, "name"), f"unknown {path[-1]} '{name}'{hint}; known: {known}")
    return _build(variant, value, path, ctx, variant_of=name)


def _convert(value: Any, tp: Any, path: KeyPath, ctx: _Context) -> Any:
    """Check ``value`` against type hint ``tp`` and return it in the schema's form (floats, tuples)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        members = typing.get_args(tp)
        if value is None and type(None) in members:
            return None
        concrete = [m for m in members if m is not type(None)]
        if len(concrete) == 1:
            return _convert(value, concrete[0], path, ctx)
        for member in concrete:
            try:
                return _convert(value, member, path, ctx)
            except ConfigError:
                continue
        raise ctx.error(path, f"expected {_expected(tp)}, got {_describe(value)}")
    if origin is Literal:
        choices = typing.get_args(tp)
        for choice in choices:
            if type(value) is type(choice) and value == choice:
                return value
        listed = ", ".join(repr(c) for c in choices)
        raise ctx.error(path, f"must be one of {listed}, got {_describe(value)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ctx.error(path, f"must be a finite number, got {value!r}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
        if value is not None and not isinstance(value, Mapping | list | tuple):
            raise ctx.error(path, f"expected a string, got {_describe(value)} (quote it to make it a string)")
    elif origin in (tuple, list):
        if isinstance(value, list | tuple):
            return _convert_sequence(value, tp, path, ctx)
    elif origin is dict:
        if isinstance(value, Mapping):
            key_type, value_type = typing.get_args(tp) or (Any, Any)
            return {
                _convert(k, key_type, (*path, str(k)), ctx): _convert(v, value_type, (*path, str(k)), ctx)
                for k, v in value.items()
            }
    elif dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, path, ctx)
    else:
        raise TypeError(f"the config loader does not support the type {tp!r} (at {_format_path(path)})")
    raise ctx.error(path, f"expected {_expected(tp)}, got {_describe(value)}")


def _convert_sequence(value: Sequence[Any], tp: Any, path: KeyPath, ctx: _Context) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list:
        item = args[0] if args else Any
        return [_convert(v, item, (*path, i), ctx) for i, v in enumerate(value)]
    if not args:
        return tuple(value)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(v, args[0], (*path, i), ctx) for i, v in enumerate(value))
    if len(value) != len(args):
        raise ctx.error(path, f"expected a list of {len(args)} items, got {len(value)}")
    return tuple(_convert(v, a, (*path, i), ctx) for i, (v, a) in enumerate(zip(value, args, strict=True)))


_BOUNDS: tuple[tuple[str, str, typing.Callable[[float, float], bool]], ...] = (
    ("ge", ">=", lambda v, b: v >= b),
    ("gt", ">", lambda v, b: v > b),
    ("le", "<=", lambda v, b: v <= b),
    ("lt", "<", lambda v, b: v < b),
)


def _check_bounds(f: dataclasses.Field[Any], value: Any, path: KeyPath, ctx: _Context) -> None:
    bounds = [(sym, f.metadata[key], ok) for key, sym, ok in _BOUNDS if key in f.metadata]
    if not bounds:
        return
    items = list(enumerate(value)) if isinstance(value, tuple | list) else [(None, value)]
    for index, item in items:
        if isinstance(item, bool) or not isinstance(item, int | float):
            continue
        if not all(ok(item, bound) for _, bound, ok in bounds):
            rule = " and ".join(f"{sym} {bound:g}" for sym, bound, _ in bounds)
            where = path if index is None else (*path, index)
            raise ctx.error(where, f"must be {rule}, got {item!r}")


def _check_path(value: str, kind: str, path: KeyPath, ctx: _Context) -> str:
    if value.startswith("trace-set:"):  # a named real trace set, shipped in the package or in the cache
        from rayfl.traces.format import TraceError
        from rayfl.traces.sets import resolve_trace_path

        try:
            return str(resolve_trace_path(value))
        except TraceError as err:
            raise ctx.error(path, str(err)) from None
    given = Path(value).expanduser()
    resolved = (given if given.is_absolute() else ctx.base_for(path) / given).resolve()
    if kind == "dir" and not resolved.is_dir():
        what = "is not a directory" if resolved.exists() else "does not exist"
        raise ctx.error(path, f"directory {value!r} {what} (resolved to {resolved})")
    if kind == "any" and not resolved.exists():
        raise ctx.error(path, f"{value!r} does not exist (resolved to {resolved})")
    if kind == "file" and not resolved.is_file():
        what = "is not a file" if resolved.exists() else "does not exist"
        raise ctx.error(path, f"file {value!r} {what} (resolved to {resolved})")
    return str(resolved)


# ------------------------------------------------------------------------------------------------- overrides
def _apply_override(raw: dict[str, Any], origins: dict[KeyPath, Origin], text: str, file: str | None) -> None:
    """Set ``a.b=c`` in the raw tree, recording the override as the origin of everything it sets."""
    key, sep, value_text = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not key or not all(p.strip() for p in parts):
        raise ConfigError("expected KEY.PATH=VALUE, e.g. train.lr=0.1", file=file, override=text)
    parts = [p.strip() for p in parts]
    try:
        value = yaml.load(value_text, Loader=_Loader)  # a SafeLoader: plain data only
    except yaml.YAMLError as err:
        raise _yaml_error(err, file, override=text) from err
    node: Any = raw
    keys: list[str | int] = []
    for depth, part in enumerate(parts):
        key_here: str | int = part
        if isinstance(node, list):
            # List items are addressed by index (``phases.0.rounds=3``); an override never grows a list.
            if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
                raise ConfigError(
                    f"'{part}' is not an index of this list of {len(node)} item(s) (use 0..{len(node) - 1})",
                    _format_path(tuple(keys)),
                    file=file,
                    override=text,
                )
            key_here = int(part) % len(node)
        keys.append(key_here)
        if depth == len(parts) - 1:
            break
        here = tuple(keys)
        child = node[int(key_here)] if isinstance(node, list) else node.get(key_here)
        if child is None and isinstance(node, dict):
            child = {}
            node[key_here] = child
            origins[here] = text
        elif not isinstance(child, dict | list):
            raise ConfigError(
                f"cannot set '{'.'.join(parts[depth + 1 :])}' inside a value that is not a mapping or list",
                _format_path(here),
                file=file,
                override=text,
            )
        node = child
    full: KeyPath = tuple(keys)
    last = keys[-1]
    if last == "name" and _tagged_table_at(full[:-1]) and node.get("name", _section_default(full[:-1])) != value:
        # A new variant starts from its own defaults: keep only keys that overrides set.
        for k in list(node):
            if not isinstance(origins.get((*full[:-1], str(k))), str):
                del node[k]
                _forget(origins, (*full[:-1], str(k)))
    node[last] = value
    _forget(origins, full)
    _mark(origins, full, value, text)


def _section_default(path: KeyPath) -> Any:
    default: Any = ExperimentConfig()
    for part in path:
        default = getattr(default, str(part), None)
    return getattr(default, "name", None)


def _forget(origins: dict[KeyPath, Origin], prefix: KeyPath) -> None:
    for known in [p for p in origins if p[: len(prefix)] == prefix]:
        del origins[known]


def _mark(origins: dict[KeyPath, Origin], path: KeyPath, value: Any, text: str) -> None:
    origins[path] = text
    if isinstance(value, Mapping):
        for k, v in value.items():
            _mark(origins, (*path, str(k)), v, text)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _mark(origins, (*path, i), v, text)


# ------------------------------------------------------------------------------------------------- rules
def validate_semantics(cfg: ExperimentConfig) -> None:
    """Check rules that span fields (``experiment/rules.py``; called by ``load_config``, also usable on configs built in
    code)."""
    problems = semantic_problems(cfg)
    if problems:
        key_path, reason = problems[0]
        raise ConfigError(reason, _format_path(key_path))


def check_clients_per_round(cfg: ExperimentConfig, num_clients: int) -> None:
    """After loading: ``clients_per_round`` (and each phase's) fits the clients the data really has."""
    reason = clients_per_round_problem(cfg, num_clients)
    if reason:
        raise ConfigError(reason, "clients_per_round")


def check_model_input(cfg: ExperimentConfig, input_kind: str) -> None:
    """After loading: the model reads the kind of input the data gives (``rules.model_input_problem``)."""
    problem = model_input_problem(cfg, input_kind)
    if problem is not None:
        raise ConfigError(problem[1], _format_path(problem[0]))


def check_output_dir(output_dir: str | Path) -> None:
    """Before a run starts Ray or loads data: a run directory can be made under ``output_dir`` (it is not a file and
    can be written; ``rules.output_dir_problem``). Creates nothing."""
    problem = output_dir_problem(output_dir)
    if problem:
        raise ConfigError(problem, "output_dir")


def check_factories(cfg: ExperimentConfig) -> None:
    """For ``rayfl validate``: a custom data set's factory imports and is callable, and a custom model's also returns
    an ``nn.Module`` (built on the meta device: ``models/custom.check_model_factory``). Imports torch, for custom
    configs only; the data is not loaded (the run checks what the factories give against it)."""
    if cfg.data.name == "custom":
        from rayfl.data.custom import check_data_factory

        check_data_factory(cfg.data)
    if isinstance(cfg.model, CustomModelConfig):
        from rayfl.models.custom import check_model_factory

        check_model_factory(cfg.model, DATA_INPUTS.get(cfg.data.name))


# ------------------------------------------------------------------------------------------------- public API
@dataclasses.dataclass
class YamlSource:
    """A YAML document as plain data, with where each value came from (a line of the file, or an override's text).

    ``load_config`` is built on it, and other YAML schemas (sweep files) use it to get the same checks and the same
    located errors: ``read`` a file, ``apply_override`` ``a.b=c`` texts, ``build`` a config dataclass, ``error`` at a
    key path, and ``part`` to treat a nested mapping (an inline experiment) as a document of its own. Relative paths
    resolve against the file's directory, or ``override_dir`` (default: the working directory) for overridden values.
    """

    data: Any
    origins: dict[KeyPath, Origin]
    file: str | None
    base_dir: Path
    override_dir: Path | None = None

    @classmethod
    def read(cls, path: str | Path) -> YamlSource:
        file = str(path)
        source = Path(path)
        try:
            text = source.read_text(encoding="utf-8")
        except FileNotFoundError as err:
            raise ConfigError("config file does not exist", file=file) from err
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"cannot read config file: {err}", file=file) from err
        data, lines = _parse_yaml(text, file)
        return cls(data=data, origins=dict(lines), file=file, base_dir=source.absolute().parent)

    @classmethod
    def empty(cls) -> YamlSource:
        """No file: every value comes from defaults or overrides."""
        return cls(data={}, origins={}, file=None, base_dir=Path.cwd())

    def _context(self) -> _Context:
        return _Context(file=self.file, base_dir=self.base_dir, origins=self.origins, override_dir=self.override_dir)

    def origin(self, key_path: KeyPath) -> Origin | None:
        """The line (or override) that set ``key_path`` or its nearest enclosing key."""
        return self._context().origin(key_path)

    def error(self, key_path: KeyPath, reason: str) -> ConfigError:
        return self._context().error(key_path, reason)

    def part(self, key_path: KeyPath) -> YamlSource:
        """The value at ``key_path`` as a document of its own (a copy), its origins re-rooted, same file and dirs."""
        data: Any = self.data
        for key in key_path:
            data = data[key]
        n = len(key_path)
        origins = {p[n:]: o for p, o in self.origins.items() if p[:n] == key_path}
        return YamlSource(
            data=copy.deepcopy(data),
            origins=origins,
            file=self.file,
            base_dir=self.base_dir,
            override_dir=self.override_dir,
        )

    def apply_override(self, text: str) -> None:
        """Set ``a.b=c`` (a YAML value) in the document; ``text`` becomes the origin of what it sets."""
        if not isinstance(self.data, dict):
            raise self.error((), f"the top level must be a mapping, got {_describe(self.data)}")
        _apply_override(self.data, self.origins, text, self.file)

    def build(self, cls: type[Any]) -> Any:
        """Instantiate config dataclass ``cls`` from the whole document, checking keys, types and bounds."""
        return _build(cls, self.data, (), self._context())


def experiment_config(source: YamlSource) -> ExperimentConfig:
    """Validate ``source`` (overrides already applied) and build the experiment config."""
    if not isinstance(source.data, dict):
        raise source.error((), f"the top level must be a mapping of sections, got {_describe(source.data)}")
    cfg: ExperimentConfig = source.build(ExperimentConfig)
    problems = semantic_problems(cfg) or trace_problems(cfg)
    if problems:
        key_path, reason = problems[0]
        raise source.error(key_path, reason)
    return cfg


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read ``path`` (``None``: the defaults), apply ``a.b=c`` overrides, validate and build the config."""
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of 'a.b=c' strings, not one string")
    source = YamlSource.empty() if path is None else YamlSource.read(path)
    if not isinstance(source.data, dict):
        raise source.error((), f"the top level must be a mapping of sections, got {_describe(source.data)}")
    if path is not None and not source.data:
        # the schema's defaults alone are no experiment anyone chose (nor the embedded default: README, Configuration)
        raise source.error(
            (),
            "the file sets no key (it is empty or holds only comments): give the keys to run, or run 'rayfl run' "
            "with no file for the embedded default",
        )
    for text in overrides:
        source.apply_override(text)
    return experiment_config(source)


def locate_error(err: ConfigError, path: str | Path | None, overrides: Sequence[str] = ()) -> ConfigError:
    """``err``, raised after loading at a key but with no file (``output_dir``, ``model.factory``, checks against the
    loaded data), located as the loader locates its own errors: at the line or the override that set the key, in the
    config ``load_config(path, overrides)`` read; ``err`` itself when it has a file already or names no key."""
    if err.file is not None or not err.key_path:
        return err
    source = YamlSource.empty() if path is None else YamlSource.read(path)
    if isinstance(source.data, dict):
        for text in overrides:
            source.apply_override(text)
    key_path = tuple(int(p[1:-1]) if p.startswith("[") else p for p in re.findall(r"\[\d+\]|[^.\[\]]+", err.key_path))
    return source.error(key_path, err.reason)  # a key no line or override set: the file alone


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, YAML-serialisable dict of a config dataclass (tuples become lists), in field order."""
    if not (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)):
        raise TypeError(f"expected a config dataclass instance, got {type(cfg).__name__}")
    return {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def dump_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write ``cfg`` as YAML that ``load_config`` reads back to an equal config."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(config_to_dict(cfg), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    target.write_text(text, encoding="utf-8")
