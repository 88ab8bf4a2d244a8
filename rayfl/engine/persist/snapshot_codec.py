"""A run snapshot as bytes that cannot execute code when read: tensors in a safetensors file, everything else a
JSON tree in that file's header.

A checkpoint used to be a pickle (``torch.save``), and unpickling runs whatever the file names, so resuming a run
directory someone else wrote was running their code. Here the file is read by two parsers that only build data: the
safetensors reader (tensors) and ``json`` (the tree). The tree names the types it rebuilds, and only these are built:

* ``None``, ``bool``, ``int``, ``float`` (NaN and infinities included), ``str`` and ``list``: JSON's own values;
* ``{"$": "dict" | "tuple" | "set" | "frozenset", "items": [...]}`` (a dict's items as ``[key, value]`` pairs, so keys
  of any type and their order survive);
* ``{"$": "tensor", "key": K}``: the safetensors entry ``K`` (a tensor that appears twice is stored once and comes
  back as one object, as pickle kept it); ``{"$": "ndarray", "key": K, "dtype": D, "shape": S}``: a NumPy array,
  stored typed where torch has its dtype and as raw bytes elsewhere; ``{"$": "objects", ...}``: an object array;
  ``{"$": "scalar", "dtype": D, "value": V}``: a NumPy scalar;
* ``{"$": "dataclass", "type": "rayfl.module:Class", "fields": {...}}``: a dataclass defined in rayfl itself (no
  other module is imported, no other class is built), rebuilt field by field as pickle does (without ``__init__``),
  each field's value checked against the field's declared type where the type is one this module can check;
* ``{"$": "enum", ...}`` (an enum of rayfl), ``{"$": "dtype", ...}`` (a torch dtype), ``{"$": "bytes", ...}`` and
  ``{"$": "generator", ...}`` (a NumPy generator's bit-generator state).

Anything else is refused with ``SnapshotFormatError`` naming where in the tree it is: when writing (a state holding
an object this format cannot keep fails at its first checkpoint, not at the resume), and when reading (a damaged or
edited file is refused rather than half-built).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import re
import struct
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

import numpy as np
import safetensors.torch
import torch

__all__ = ["SnapshotFormatError", "decode", "encode"]

_TREE_KEY = "rayfl.snapshot"
_MODULE = re.compile(r"rayfl(\.[A-Za-z_][A-Za-z0-9_]*)*")
_QUALNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_BIT_GENERATORS = {
    "PCG64": np.random.PCG64,
    "PCG64DXSM": np.random.PCG64DXSM,
    "Philox": np.random.Philox,
    "SFC64": np.random.SFC64,
    "MT19937": np.random.MT19937,
}
_MAX_HEADER_BYTES = 100_000_000  # the safetensors reader's own limit


class SnapshotFormatError(ValueError):
    """A value this format does not keep (writing), or a file that is not a well-formed snapshot (reading)."""


# ------------------------------------------------------------------------------------------------------- writing


def encode(obj: object) -> bytes:
    """``obj`` as the bytes of a safetensors file whose header holds the JSON tree (module docstring)."""
    writer = _Encoder()
    tree = writer.value(obj, "snapshot")
    text = json.dumps(tree, separators=(",", ":"), allow_nan=True)
    return safetensors.torch.save(writer.tensors, metadata={_TREE_KEY: text})


class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._keys: dict[int, str] = {}  # id of a tensor already stored -> its key
        self._keep: list[object] = []  # the stored objects, alive until the end (their ids stay unique)
        self._storages: set[tuple[int, int]] = set()

    def _store(self, tensor: torch.Tensor) -> str:
        key = f"t{len(self.tensors)}"
        data = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
        storage = (data.untyped_storage().data_ptr(), data.untyped_storage().nbytes())
        if data.numel() and storage in self._storages:  # a view of a stored tensor: safetensors stores no aliases
            data = data.clone()
        elif data.numel():
            self._storages.add(storage)
        self.tensors[key] = data
        return key

    def value(self, obj: object, at: str) -> object:
        if obj is None or type(obj) in (bool, int, float, str):
            return obj
        if type(obj) is list:
            return [self.value(x, f"{at}[{k}]") for k, x in enumerate(obj)]
        if type(obj) is dict:
            return {
                "$": "dict",
                "items": [[self.value(k, f"{at} key"), self.value(v, f"{at}[{k!r}]")] for k, v in obj.items()],
            }
        if type(obj) in (tuple, set, frozenset):
            items = [self.value(x, f"{at}[{k}]") for k, x in enumerate(typing.cast(tuple[object, ...], obj))]
            return {"$": type(obj).__name__, "items": items}
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, at)
        if isinstance(obj, np.ndarray):
            return self._array(obj, at)
        if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
            return {"$": "scalar", "dtype": obj.dtype.str, "value": obj.item()}
        if isinstance(obj, enum.Enum) and type(obj).__module__.startswith("rayfl."):
            return {"$": "enum", "type": _type_name(type(obj)), "value": self.value(obj.value, f"{at}.value")}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and type(obj).__module__.startswith("rayfl."):
            fields = {f.name: self.value(getattr(obj, f.name), f"{at}.{f.name}") for f in dataclasses.fields(obj)}
            return {"$": "dataclass", "type": _type_name(type(obj)), "fields": fields}
        if isinstance(obj, torch.dtype):
            return {"$": "dtype", "name": str(obj).removeprefix("torch.")}
        if type(obj) is bytes:
            return {"$": "bytes", "hex": obj.hex()}
        if type(obj) is np.random.Generator and type(obj.bit_generator).__name__ in _BIT_GENERATORS:
            return {"$": "generator", "state": self.value(obj.bit_generator.state, f"{at}.state")}
        raise SnapshotFormatError(f"a checkpoint cannot keep the {type(obj).__qualname__} at {at}")

    def _tensor(self, t: torch.Tensor, at: str) -> dict[str, object]:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.is_quantized:
            raise SnapshotFormatError(f"a checkpoint cannot keep the {type(t).__qualname__} ({t.layout}) at {at}")
        key = self._keys.get(id(t))
        if key is None:
            key = self._keys[id(t)] = self._store(t)
            self._keep.append(t)
        node: dict[str, object] = {"$": "tensor", "key": key}
        if isinstance(t, torch.nn.Parameter):
            node["parameter"] = True
        if t.requires_grad:
            node["requires_grad"] = True
        if t.device.type != "cpu":
            node["device"] = str(t.device)
        return node

    def _array(self, a: np.ndarray, at: str) -> dict[str, object]:
        if type(a) is not np.ndarray:
            raise SnapshotFormatError(f"a checkpoint cannot keep the {type(a).__qualname__} at {at}")
        if a.dtype.hasobject:
            if a.dtype != np.dtype(object):
                raise SnapshotFormatError(f"a checkpoint cannot keep an array of dtype {a.dtype} at {at}")
            items = [self.value(x, f"{at}.flat[{k}]") for k, x in enumerate(a.ravel())]
            return {"$": "objects", "shape": list(a.shape), "items": items}
        data = np.ascontiguousarray(a)
        try:
            tensor, raw = torch.from_numpy(data.copy()), False
        except TypeError:  # a dtype torch lacks (strings, unsigned wide ints, ...): its bytes
            tensor, raw = torch.from_numpy(np.frombuffer(data.tobytes(), dtype=np.uint8).copy()), True
        node: dict[str, object] = {
            "$": "ndarray",
            "key": self._store(tensor),
            "dtype": a.dtype.str,
            "shape": list(a.shape),
        }
        if raw:
            node["raw"] = True
        return node


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# ------------------------------------------------------------------------------------------------------- reading


def decode(raw: bytes) -> object:
    """The object ``encode`` wrote; ``SnapshotFormatError`` for bytes that are not such a file, with where in it."""
    if len(raw) < 8:
        raise SnapshotFormatError(f"{len(raw)} bytes, too few for a safetensors file")
    (size,) = struct.unpack("<Q", raw[:8])
    if size > min(_MAX_HEADER_BYTES, len(raw) - 8):
        raise SnapshotFormatError(f"its header claims {size} bytes; the file holds {len(raw) - 8} after the size")
    try:
        header = json.loads(raw[8 : 8 + size])
        text = header["__metadata__"][_TREE_KEY]
        tree = json.loads(text)
        tensors = safetensors.torch.load(raw)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, safetensors.SafetensorError) as err:
        raise SnapshotFormatError(f"not a rayfl snapshot ({type(err).__name__}: {err})") from err
    return _Decoder(tensors).value(tree, "snapshot")


class _Decoder:
    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self._built: dict[str, torch.Tensor] = {}

    def value(self, node: object, at: str) -> object:
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is list:
            return [self.value(x, f"{at}[{k}]") for k, x in enumerate(node)]
        if type(node) is not dict:
            raise SnapshotFormatError(f"{at}: a {type(node).__name__} is no value of this format")
        tag = node.get("$")
        build = self._BUILDERS.get(tag) if isinstance(tag, str) else None
        if build is None:
            raise SnapshotFormatError(f"{at}: unknown node {tag!r}")
        return build(self, node, at)

    def _items(self, node: dict[str, Any], at: str) -> list[object]:
        items = _field(node, "items", list, at)
        return [self.value(x, f"{at}[{k}]") for k, x in enumerate(items)]

    def _dict(self, node: dict[str, Any], at: str) -> dict[object, object]:
        out: dict[object, object] = {}
        for k, pair in enumerate(_field(node, "items", list, at)):
            if type(pair) is not list or len(pair) != 2:
                raise SnapshotFormatError(f"{at}[{k}]: a dict item is a [key, value] pair")
            key = self.value(pair[0], f"{at} key {k}")
            try:
                out[key] = self.value(pair[1], f"{at}[{key!r}]")
            except TypeError as err:  # an unhashable key
                raise SnapshotFormatError(f"{at} key {k}: {err}") from err
        return out

    def _collection(self, node: dict[str, Any], at: str) -> object:
        kind = {"tuple": tuple, "set": set, "frozenset": frozenset}[node["$"]]
        try:
            return kind(self._items(node, at))
        except TypeError as err:
            raise SnapshotFormatError(f"{at}: {err}") from err

    def _tensor(self, node: dict[str, Any], at: str) -> torch.Tensor:
        key = _field(node, "key", str, at)
        if key in self._built:
            return self._built[key]
        tensor = self._stored(key, at)
        if node.get("requires_grad", False) is True:
            tensor.requires_grad_(True)
        if node.get("parameter", False) is True:
            tensor = torch.nn.Parameter(tensor, requires_grad=tensor.requires_grad)
        device = node.get("device")
        if isinstance(device, str) and device.split(":")[0] == "cuda" and torch.cuda.is_available():
            tensor = tensor.to(device)
        self._built[key] = tensor
        return tensor

    def _stored(self, key: str, at: str) -> torch.Tensor:
        if key not in self.tensors:
            raise SnapshotFormatError(f"{at}: no tensor {key!r} in the file")
        return self.tensors[key]

    def _array(self, node: dict[str, Any], at: str) -> np.ndarray:
        tensor = self._stored(_field(node, "key", str, at), at)
        dtype, shape = _dtype(node, at), _shape(node, at)
        if node.get("raw", False) is True:
            data = tensor.numpy().tobytes()
            if tensor.dtype != torch.uint8 or len(data) != dtype.itemsize * int(np.prod(shape)):
                raise SnapshotFormatError(f"{at}: {len(data)} bytes do not make a {dtype} array of shape {shape}")
            return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        array = tensor.numpy()
        if array.dtype != dtype or array.shape != shape:
            raise SnapshotFormatError(f"{at}: a {array.dtype}{array.shape} tensor where {dtype}{shape} is declared")
        return array

    def _objects(self, node: dict[str, Any], at: str) -> np.ndarray:
        shape = _shape(node, at)
        items = self._items(node, at)
        if len(items) != int(np.prod(shape)):
            raise SnapshotFormatError(f"{at}: {len(items)} items do not fill shape {shape}")
        out = np.empty(len(items), dtype=object)
        for k, item in enumerate(items):  # one by one: a list item must not broadcast
            out[k] = item
        return out.reshape(shape)

    def _scalar(self, node: dict[str, Any], at: str) -> np.generic:
        dtype = _dtype(node, at)
        value = node.get("value")
        kinds = {"b": (bool,), "i": (int,), "u": (int,), "f": (float, int)}
        if dtype.kind not in kinds or type(value) not in kinds[dtype.kind]:
            raise SnapshotFormatError(f"{at}: {value!r} is no {dtype} scalar")
        return typing.cast(np.generic, dtype.type(value))

    def _enum(self, node: dict[str, Any], at: str) -> enum.Enum:
        cls = _rayfl_type(node, at)
        if not issubclass(cls, enum.Enum):
            raise SnapshotFormatError(f"{at}: {node['type']} is not an enum")
        try:
            return cls(self.value(node.get("value"), f"{at}.value"))
        except ValueError as err:
            raise SnapshotFormatError(f"{at}: {err}") from err

    def _dataclass(self, node: dict[str, Any], at: str) -> object:
        cls = _rayfl_type(node, at)
        if not dataclasses.is_dataclass(cls):
            raise SnapshotFormatError(f"{at}: {node['type']} is not a dataclass")
        given = _field(node, "fields", dict, at)
        fields = dataclasses.fields(cls)
        names = {f.name for f in fields}
        # a field added to the class since the checkpoint was written takes its default (a checkpoint of an earlier
        # rayfl stays readable); a field the class does not have, or a missing one without a default, is refused
        missing = {f.name for f in fields if f.name not in given and not _has_default(f)}
        if not set(given) <= names or missing:
            raise SnapshotFormatError(
                f"{at}: fields {sorted(given)}, {cls.__qualname__} has {[f.name for f in fields]}"
            )
        hints = _hints(cls)
        obj = cls.__new__(cls)
        for f in fields:
            if f.name not in given:
                object.__setattr__(obj, f.name, _default(f))
                continue
            value = self.value(given[f.name], f"{at}.{f.name}")
            hint = hints.get(f.name)
            if hint is not None and not _conforms(value, hint):
                raise SnapshotFormatError(
                    f"{at}.{f.name}: a {type(value).__name__} where {cls.__qualname__} declares {_hint_text(hint)}"
                )
            object.__setattr__(obj, f.name, value)
        return obj

    def _dtype_node(self, node: dict[str, Any], at: str) -> torch.dtype:
        found = getattr(torch, _field(node, "name", str, at), None)
        if not isinstance(found, torch.dtype):
            raise SnapshotFormatError(f"{at}: {node['name']!r} is no torch dtype")
        return found

    def _bytes(self, node: dict[str, Any], at: str) -> bytes:
        try:
            return bytes.fromhex(_field(node, "hex", str, at))
        except ValueError as err:
            raise SnapshotFormatError(f"{at}: {err}") from err

    def _generator(self, node: dict[str, Any], at: str) -> np.random.Generator:
        state = self.value(node.get("state"), f"{at}.state")
        kind = _BIT_GENERATORS.get(state.get("bit_generator", "")) if isinstance(state, dict) else None
        if kind is None:
            raise SnapshotFormatError(f"{at}: not a NumPy bit generator's state")
        bits = kind()
        try:
            bits.state = typing.cast(dict[str, Any], state)
        except (ValueError, TypeError, KeyError) as err:
            raise SnapshotFormatError(f"{at}: {err}") from err
        return np.random.Generator(bits)

    _BUILDERS: typing.ClassVar[dict[str, Callable[[_Decoder, dict[str, Any], str], object]]] = {
        "dict": _dict,
        "tuple": _collection,
        "set": _collection,
        "frozenset": _collection,
        "tensor": _tensor,
        "ndarray": _array,
        "objects": _objects,
        "scalar": _scalar,
        "enum": _enum,
        "dataclass": _dataclass,
        "dtype": _dtype_node,
        "bytes": _bytes,
        "generator": _generator,
    }


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]


def _field(node: dict[str, Any], key: str, kind: type, at: str) -> Any:
    value = node.get(key)
    if type(value) is not kind:
        raise SnapshotFormatError(f"{at}: {node.get('$')} node needs {key!r} as a {kind.__name__}, not {value!r:.60}")
    return value


def _dtype(node: dict[str, Any], at: str) -> np.dtype[Any]:
    try:
        dtype: np.dtype[Any] = np.dtype(_field(node, "dtype", str, at))
    except (TypeError, ValueError) as err:
        raise SnapshotFormatError(f"{at}: {err}") from err
    if dtype.hasobject:
        raise SnapshotFormatError(f"{at}: an object dtype is stored as an objects node")
    return dtype


def _shape(node: dict[str, Any], at: str) -> tuple[int, ...]:
    shape = _field(node, "shape", list, at)
    if not all(type(n) is int and n >= 0 for n in shape):
        raise SnapshotFormatError(f"{at}: shape {shape!r} is not a list of sizes")
    return tuple(shape)


def _rayfl_type(node: dict[str, Any], at: str) -> type:
    """The class a node names, found only among rayfl's own modules (nothing else is imported)."""
    name = _field(node, "type", str, at)
    module_name, _, qualname = name.partition(":")
    if not _MODULE.fullmatch(module_name) or not _QUALNAME.fullmatch(qualname) or "__" in qualname:
        raise SnapshotFormatError(f"{at}: {name!r} is not a class of rayfl")
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as err:
        raise SnapshotFormatError(f"{at}: no module {module_name} in this rayfl") from err
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, type) or found.__module__ != module_name:
        raise SnapshotFormatError(f"{at}: no class {qualname} in {module_name}")
    return found


_HINTS: dict[type, dict[str, object]] = {}


def _hints(cls: type) -> dict[str, object]:
    """Each field's declared type, evaluated in its module (a field whose annotation does not evaluate there, e.g. a
    name imported only for type checkers, is not checked)."""
    if cls not in _HINTS:
        namespace = vars(sys.modules[cls.__module__])
        hints: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            try:
                hints[f.name] = eval(f.type, namespace) if isinstance(f.type, str) else f.type
            except Exception:  # an annotation of rayfl's own source that does not evaluate at run time
                continue
        _HINTS[cls] = hints
    return _HINTS[cls]


def _conforms(value: object, hint: object) -> bool:
    """Whether ``value`` fits the declared type ``hint``, as far as it can be told (unknown forms fit)."""
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is float:
        return isinstance(value, float | int | np.floating | np.integer) and not isinstance(value, bool | np.bool_)
    if hint is int:
        return isinstance(value, int | np.integer) and not isinstance(value, bool)
    if hint is bool:
        return isinstance(value, bool | np.bool_)
    if origin is typing.Literal:
        return value in args
    if origin is None:
        return not isinstance(hint, type) or isinstance(value, hint)
    if not isinstance(origin, type) or not isinstance(value, origin):
        return not isinstance(origin, type)
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(x, args[0]) for x in typing.cast(tuple[object, ...], value))
        return len(typing.cast(tuple[object, ...], value)) == len(args) and all(
            _conforms(x, a) for x, a in zip(typing.cast(tuple[object, ...], value), args, strict=True)
        )
    if origin in (list, set, frozenset) and len(args) == 1:
        return all(_conforms(x, args[0]) for x in typing.cast(list[object], value))
    if origin is dict and len(args) == 2:
        items = typing.cast(dict[object, object], value).items()
        return all(_conforms(k, args[0]) and _conforms(v, args[1]) for k, v in items)
    return True


def _hint_text(hint: object) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
