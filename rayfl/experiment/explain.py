"""``rayfl validate --explain FILE``: every value a config resolves to, and where it came from.

Each key of the resolved config (as ``config.yaml`` in a run directory holds it) is listed once, with its origin: a
line of the file (``file.yaml:12``), an override (``override 'train.lr=0.1'``), or ``default`` (neither set it: the
config class's default, ``docs/config-reference.md``). The origins are the loader's own (``YamlSource.origins``), so
the answer is the one its errors would give. Imports neither torch nor Ray.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rayfl.core.errors import KeyPath
from rayfl.experiment.loader import YamlSource, config_to_dict, experiment_config, format_key_path

__all__ = ["explain", "explained_values"]


def _leaves(value: Any, path: KeyPath) -> Iterator[tuple[KeyPath, Any]]:
    """The scalar values of a plain config tree; lists of scalars are one value, lists of sections are walked."""
    if isinstance(value, dict) and value and path[-1:] not in (("kwargs",),):
        for key, child in value.items():
            yield from _leaves(child, (*path, key))
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, child in enumerate(value):
            yield from _leaves(child, (*path, i))
    else:
        yield path, value


def _where(source: YamlSource, path: KeyPath) -> str:
    """The origin of ``path``: the line or override that set it (or the mapping or list written on one line that holds
    it), ``default`` when the document does not hold it."""
    if not _set(source.data, path):
        return "default"
    origin = source.origin(path)
    if isinstance(origin, str):
        return f"override '{origin}'"
    if origin is None:
        return "default"
    return f"{Path(source.file).name if source.file else '<config>'}:{origin}"


def _set(node: Any, path: KeyPath) -> bool:
    """Whether the raw document holds ``path`` itself (a default is not in it)."""
    for key in path:
        if isinstance(node, dict):
            if key not in node:
                return False
        elif not (isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)):
            return False
        node = node[key]
    return True


def explained_values(path: str | Path | None, overrides: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """``(key, value as YAML, origin)`` for every resolved key of the config ``path`` with ``overrides`` (checked as
    ``load_config`` checks it; a bad config raises its ``ConfigError``)."""
    import yaml

    source = YamlSource.empty() if path is None else YamlSource.read(path)
    if isinstance(source.data, dict):
        for text in overrides:
            source.apply_override(text)
    cfg = experiment_config(source)
    rows = []
    for key_path, value in _leaves(config_to_dict(cfg), ()):
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        rows.append((format_key_path(key_path), text, _where(source, key_path)))
    return rows


def explain(path: str | Path | None, overrides: Sequence[str] = ()) -> str:
    """``explained_values`` as aligned text, one key a line: ``key = value  # origin``."""
    rows = explained_values(path, overrides)
    width = max((len(k) + len(v) for k, v, _ in rows), default=0) + 3
    return "\n".join(f"{f'{k} = {v}':<{width}}  # {w}" for k, v, w in rows) + "\n"
