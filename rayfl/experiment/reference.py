"""The config reference, generated from the config dataclasses themselves: every key an experiment file can set, its
type, default, bounds and one-line doc (the comment written beside or above the field, else the first sentence the
section's docstring gives it), section by section and variant by variant (``model``, ``algorithm`` by ``name``).

``docs/config-reference.md`` is this module's output
(``python -m rayfl.experiment.reference > docs/config-reference.md``); a test keeps the two in sync, so a field
added, renamed or re-documented shows up in review as a change to the file.
Walks the dataclasses from ``ExperimentConfig`` down, wherever they are defined; imports neither torch nor Ray.
``entries`` and ``render_tables`` take another root too: the sweep file's reference (``rayfl/tune/reference.py``) is
the same walk from ``SweepConfig``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Union

from rayfl.experiment.schema import ExperimentConfig

__all__ = ["Entry", "entries", "field_docs", "render_reference", "render_tables"]

_REQUIRED = object()  # the value of a field without a default, which the file must set


@dataclass(frozen=True)
class Entry:
    """One key of the reference: its dotted path (``[i]`` for list items), type, default, bounds and doc."""

    key: str
    type_text: str
    default: str
    bounds: str
    doc: str


def _sections(
    cls: type[Any], prefix: str, title: str, default: Any = None, note: str = ""
) -> Iterator[tuple[str, str, type[Any], Any, str]]:
    """``(prefix, heading, dataclass, its default value, a note)`` for ``cls`` and every section below it, depth
    first; a section inside a variant is titled with the variant (``algorithm.distill (algorithm.name: heterofl)``).
    The default is the enclosing section's (``system.compute`` defaults to a constant speed, not to an empty source);
    a section that is ``null`` by default says so in its note, with its field's comment."""
    default = default if isinstance(default, cls) else _instance(cls)
    yield prefix, title, cls, default, note
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    context = title[title.index("(") :] if "(" in title else ""
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = _value(default, f)
        tagged = f.metadata.get("tagged")
        if tagged:
            for name, sub in tagged.items():
                yield from _sections(sub, key, f"{key}.name: {name}", value)
            continue
        for sub in _dataclasses_in(hints[f.name]):
            inner = f"{key}[i]" if typing.get_origin(hints[f.name]) in (tuple, list) else key
            where = title if ".name: " in title and not context else context.strip("()")
            absent = f"`{inner}` is `null` by default ({docs.get(f.name, 'left out')})." if value is None else ""
            yield from _sections(sub, inner, f"{inner} ({where})" if where else inner, value, absent)


def _instance(cls: type[Any]) -> Any:
    """``cls()``, or ``None`` when a field has no default (``PlotConfig.x``): its fields' own defaults are used."""
    try:
        return cls()
    except TypeError:
        return None


def _value(default: Any, f: dataclasses.Field[Any]) -> Any:
    """The field's value in the section's ``default``, else its own default; ``_REQUIRED`` when it has none."""
    if default is not None:
        return getattr(default, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _REQUIRED


def _dataclasses_in(tp: Any) -> list[type[Any]]:
    """The dataclasses a field's type holds directly: ``X``, ``X | None``, ``tuple[X, ...]``."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return [tp]
    if typing.get_origin(tp) in (Union, types.UnionType, tuple, list):
        return [a for arg in typing.get_args(tp) if arg is not Ellipsis for a in _dataclasses_in(arg)]
    return []


def type_text(tp: Any) -> str:
    """A field's type as a reader of YAML needs it: ``int``, ``float >= 0``, ``'iid' | 'dirichlet'``, ``list[int]``."""
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and not origin:
        if dataclasses.is_dataclass(tp):
            return "section"
        return "mapping" if tp is dict else tp.__name__
    if origin is Literal:
        return " | ".join(repr(c) for c in typing.get_args(tp))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list[{type_text(args[0])}]" if args else "list"
    if origin is dict:
        return "mapping"
    if origin in (Union, types.UnionType):
        return " | ".join(type_text(a) for a in typing.get_args(tp))
    return str(tp)


def _yaml_text(value: Any) -> str:
    if value is None:
        return "null"
    if value is _REQUIRED:
        return "(required)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_yaml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return repr(value)
    if dataclasses.is_dataclass(value):
        return "(section)"
    return repr(value)


def _bounds_text(f: dataclasses.Field[Any]) -> str:
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    parts = [f"{sign} {f.metadata[k]:g}" for k, sign in signs.items() if k in f.metadata]
    if "path" in f.metadata:
        kind = f.metadata["path"]
        parts.append("an existing file or dir" if kind == "any" else f"an existing {kind}")
    return ", ".join(parts)


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Each field's comment in ``cls``'s source: the comment after it on its line, else the comment lines right above
    it (joined into one line); fields without either are left out."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    docs: dict[str, str] = {}
    body = ast.parse(source).body[0]
    for node in getattr(body, "body", []):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        end = node.end_lineno or node.lineno
        trailing = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        text = " ".join(trailing or above)
        if text:
            docs[node.target.id] = text
    return docs


def entries(root: type[Any] = ExperimentConfig) -> list[tuple[str, str, str, list[Entry]]]:
    """The reference's sections below ``root``: ``(prefix, heading, the docstring's first paragraph, its leaf
    entries)``; a section whose class was listed already (a phase's algorithm, the distillation of another method) has
    no entries and a summary naming the heading that lists them."""
    out: list[tuple[str, str, str, list[Entry]]] = []
    seen: dict[tuple[type[Any], str], str] = {}  # (class, its defaults) -> the heading that lists them
    repeated: list[str] = []  # prefixes of sections listed as repeats: their own sections are repeats too
    for prefix, title, cls, default, note in _sections(root, "", "top level"):
        if any(prefix.startswith(f"{r}.") for r in repeated):
            continue
        if (cls, repr(default)) in seen:
            out.append((prefix, title, f"The keys of `{seen[cls, repr(default)]}`, under `{prefix}`.", []))
            repeated.append(prefix)
            continue
        seen[cls, repr(default)] = title
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        rows = []
        for f in dataclasses.fields(cls):
            if f.metadata.get("tagged") or (_dataclasses_in(hints[f.name]) and not _has_scalar(hints[f.name])):
                continue  # a section: listed under its own heading
            key = f"{prefix}.{f.name}" if prefix else f.name
            value = _yaml_text(_value(default, f))
            rows.append(Entry(key, type_text(hints[f.name]), value, _bounds_text(f), docs.get(f.name, "")))
        summary = " ".join(s for s in ((inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " "), note) if s)
        out.append((prefix, title, summary, rows))
    return out


def _has_scalar(tp: Any) -> bool:
    """A union that also admits a non-section value other than null (kept as a key of its own)."""
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return False
    return any(not dataclasses.is_dataclass(a) and a is not type(None) for a in typing.get_args(tp))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "—"


def render_reference() -> str:
    """The whole reference as Markdown (what ``docs/config-reference.md`` holds)."""
    lines = [
        "# Config reference",
        "",
        "Generated from the config dataclasses by `python -m rayfl.experiment.reference` (a test keeps this file in",
        "sync: regenerate it after changing a config class). Keys are dotted paths as overrides write them",
        "(`train.lr=0.1`); `[i]` is a list item (`phases.0.rounds=3`). A section with variants (`model`, `algorithm`)",
        "lists each variant's keys under its `name`. `rayfl validate --explain FILE` shows the values a config",
        "resolves to and where each came from.",
        "",
    ]
    return "\n".join(lines + render_tables(ExperimentConfig))


def render_tables(root: type[Any]) -> list[str]:
    """The reference's sections below ``root`` as Markdown lines: a heading, the summary and the table of keys each."""
    lines: list[str] = []
    for _, title, summary, rows in entries(root):
        lines += [f"## `{title}`", "", summary, ""] if summary else [f"## `{title}`", ""]
        if not rows:
            continue
        lines += ["| Key | Type | Default | Bounds | Doc |", "|---|---|---|---|---|"]
        for e in rows:
            lines.append(f"| `{e.key}` | {_cell(e.type_text)} | `{e.default}` | {_cell(e.bounds)} | {_cell(e.doc)} |")
        lines.append("")
    return lines


if __name__ == "__main__":
    print(render_reference(), end="")
