"""Typed configs: dataclasses built from TOML/JSON/YAML mappings, with errors that name the key path.

`build_config(cls, mapping)` walks the dataclass fields: unknown keys, wrong types and values that a
dataclass's own `__post_init__` rejects all become one `ConfigError` line such as
``episode.optimizer.host_lr: must be > 0, got -1.0``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from morphogen.limits import MAX_INTEGER_SETTING, MAX_STRING_LENGTH, short_repr
from morphogen.run_directory import MAX_JSON_BYTES, read_regular_file
from morphogen.user_paths import user_path

T = TypeVar("T")

class ConfigError(ValueError):
    """A configuration the user wrote that cannot be used; the message names the key path."""


def _describe(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(repr(member.value) for member in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _convert_union(value: Any, options: tuple[Any, ...], path: str) -> Any:
    if value is None and type(None) in options:
        return None
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _convert(value, option, path)
        except ConfigError as error:
            errors.append(str(error))
    raise ConfigError(errors[0] if errors else f"{path}: unexpected value {short_repr(value)}")


def _convert_enum(value: Any, annotation: type[enum.Enum], path: str) -> Any:
    for member in annotation:
        if value == member.value or (isinstance(value, str) and value.lower() == member.name.lower()):
            return member
    raise ConfigError(f"{path}: {short_repr(value)} is not {_describe(annotation)}")


def _is_finite(value: float) -> bool:
    """Finite and representable as a float (an integer past 1.8e308 is neither)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


#: Scalar annotation -> (accepts value?, converter, what the error says was expected).
_SCALARS: dict[Any, tuple[Any, Any, str]] = {
    bool: (lambda v: isinstance(v, bool), bool, "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), int, "an integer"),
    # NaN and infinity are never usable settings (an infinite learning rate makes every weight NaN).
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and _is_finite(v), float,
            "a finite number (not NaN or infinity)"),
    str: (lambda v: isinstance(v, str) and len(v) <= MAX_STRING_LENGTH, str,
          f"a string of at most {MAX_STRING_LENGTH} characters"),
}


def _field_default(field: dataclasses.Field[Any]) -> Any:
    """The default value of a dataclass field (None if it has none)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def _convert(value: Any, annotation: Any, path: str, default: Any = None) -> Any:
    """`value` converted to `annotation`; a table for a config dataclass is laid over `default` if it is one."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(value, typing.get_args(annotation), path)
    if value is None and (dataclasses.is_dataclass(annotation) or origin is dict):
        value = {}  # a YAML section with nothing under it (`episode:`, its keys commented out), as TOML's `[episode]`
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a table of settings, got {short_repr(value)}")
        base = default if isinstance(default, annotation) else None  # type: ignore[arg-type]
        return build_config(annotation, value, path, base)  # type: ignore[arg-type]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _convert_enum(value, annotation, path)
    if origin in (tuple, frozenset):
        return _convert_sequence(value, annotation, path)
    if annotation in _SCALARS:
        return _convert_scalar(value, annotation, path)
    return value


def _convert_sequence(value: Any, annotation: Any, path: str) -> tuple[Any, ...] | frozenset[Any]:
    """A list in a config file as the tuple or frozenset `annotation` asks for, each item converted."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{path}: expected a list, got {short_repr(value)}")
    args = typing.get_args(annotation)
    item = args[0] if args else Any
    converted = [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    return tuple(converted) if typing.get_origin(annotation) is tuple else frozenset(converted)


def _convert_scalar(value: Any, annotation: Any, path: str) -> Any:
    """A bool, int, float or str setting, checked (an int must fit in 64 bits)."""
    accepts, converter, expected = _SCALARS[annotation]
    if not accepts(value):
        raise ConfigError(f"{path}: expected {expected}, got {short_repr(value)}")
    if annotation is int and abs(value) > MAX_INTEGER_SETTING:
        raise ConfigError(f"{path}: must fit in 64 bits (at most {MAX_INTEGER_SETTING:,} in size), "
                          f"got {short_repr(value)}")
    return converter(value)


def build_config(cls: type[T], values: Mapping[str, Any], path: str = "", base: T | None = None) -> T:
    """Instantiate dataclass `cls` from `values`, validating every key and value.

    Keys left out keep their value in `base` when given (the default a containing config chose for this
    table), else the class's default.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields), key=str)  # YAML keys need not be strings
    prefix = f"{path}." if path else ""
    if unknown:
        key = unknown[0] if isinstance(unknown[0], str) and len(unknown[0]) <= 60 else short_repr(unknown[0])
        raise ConfigError(f"{prefix}{key}: unknown key; accepted: {', '.join(fields)}")
    if base is None:
        _refuse_missing_keys(fields, values, path or cls.__name__)
    kwargs = {name: _convert(value, hints[name], prefix + name,
                             default=_field_default(fields[name]) if base is None else getattr(base, name))
              for name, value in values.items()}
    try:
        # Over `base`, a table changes only the keys it names: `TrainConfig.episode` defaults to permissive
        # gates while `EpisodeConfig()` has strict ones, and `[episode] max_epochs` must not reset them.
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)  # type: ignore[type-var]
    except (ValueError, TypeError) as error:
        raise ConfigError(_located_message(str(error), list(fields), list(values), path or cls.__name__,
                                           prefix)) from None


def _refuse_missing_keys(fields: Mapping[str, dataclasses.Field[Any]], values: Mapping[str, Any], path: str) -> None:
    """`ConfigError` naming the table at `path` and the fields without a default that `values` leaves out."""
    missing = [name for name, spec in fields.items() if name not in values
               and spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{path}: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")


def _located_message(message: str, field_names: list[str], given: list[str], fallback: str, prefix: str) -> str:
    """Prefix a dataclass's own validation message with the key path of the field it names.

    The field is the first one the message mentions, preferring fields the user set; a leading
    repetition of the field name is dropped (``max_epochs must be >= 1`` -> ``episode.max_epochs: must be >= 1``).
    A message that already starts with a field or a key path inside one (``host.base_channels: ...``, for a
    table whose keys a dataclass cannot list) keeps that path under the prefix.
    """
    located = re.match(r"(\w+)(?:\.[\w.]+)?: ", message)
    if located is not None and located.group(1) in field_names:
        return prefix + message
    positions = {}
    for name in field_names:
        found = re.search(rf"\b{re.escape(name)}\b", message)
        if found is not None:
            positions[name] = found.start()
    if not positions:
        return f"{fallback}: {message}"
    name = min(positions, key=lambda candidate: (candidate not in given, positions[candidate]))
    if message.startswith(name + " "):
        message = message[len(name) + 1:]
    return f"{prefix}{name}: {message}"


#: Largest config file read (a real one is a few kB; a run directory's config.json too).
MAX_CONFIG_BYTES = MAX_JSON_BYTES


def merge_tables(values: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` laid on `values`: a table in both is merged key by key, at every depth; anything else is replaced."""
    merged = dict(values)
    for key, value in over.items():
        below = merged.get(key)
        merged[key] = merge_tables(below, value) if isinstance(value, Mapping) and isinstance(below, Mapping) \
            else value
    return merged


#: Where the presets shipped with morphogen live: a preset is a config file named by its stem.
PRESETS_DIRECTORY = Path(__file__).resolve().parent / "presets"


def preset_names() -> list[str]:
    """The names of the presets shipped with morphogen (`--config NAME`, `morphogen.load_config(NAME)`)."""
    return sorted(path.stem for path in PRESETS_DIRECTORY.glob("*.toml"))


def preset_description(name: str) -> str:
    """What a preset is for: the first line of its file, a comment."""
    first = (PRESETS_DIRECTORY / f"{name}.toml").read_text(encoding="utf-8").splitlines()[0]
    return first.removeprefix("#").strip()


def read_config_source(source: str | os.PathLike[str]) -> dict[str, Any]:
    """The values of a config file, or of a preset named by `source`: a plain name, without a directory or suffix."""
    path = Path(user_path(source))
    names = preset_names()
    if path.suffix or len(path.parts) != 1:
        if len(path.parts) == 1 and path.stem in names and not os.path.lexists(path):
            raise ConfigError(f"config file {path} does not exist; the preset {path.stem} is "
                              "named without a suffix")
        return read_config_file(path)
    if path.name not in names:
        found = " (it is a directory)" if path.is_dir() else ""
        close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
        guess = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"config {short_repr(str(source))}: not a preset ({', '.join(names)}) nor a file{found} "
                          f"(a config file ends in .toml, .json, .yaml or .yml){guess}")
    return read_config_file(PRESETS_DIRECTORY / f"{path.name}.toml")


class _RepeatedKey(ValueError):
    """A key given twice in one table of a JSON or YAML file (whose parsers would keep the last silently)."""


def _table_without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice: the one that is not used would look set."""
    table: dict[str, Any] = {}
    for key, value in pairs:
        if key in table:
            raise _RepeatedKey(f"key {short_repr(key)} is given twice in one table")
        table[key] = value
    return table


#: A number with an exponent and no decimal point (`1e-3`): a float in YAML 1.2, TOML and JSON, but a string to
#: PyYAML's YAML 1.1, where `host_lr: 1e-3` would be refused as "got '1e-3'".
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


#: PyYAML's YAML 1.1 tag of an unquoted date (`2024-01-01`): no setting is a date, and YAML 1.2 reads it as text.
_YAML_TIMESTAMP = "tag:yaml.org,2002:timestamp"


def _yaml_loader() -> type[Any]:
    """yaml's SafeLoader, refusing a key given twice in one mapping as TOML does (keys a `<<` merge brings in may
    be overridden, as YAML means them to be), and reading `1e-3` as the float and `2024-01-01` as the string YAML
    1.2 makes them (`run_dir: 2024-01-01` names a directory; `seed: 2024-01-01` is refused as text, not as a
    `datetime.date`)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]  # yaml has no stubs here
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise _RepeatedKey(f"key {short_repr(key)} is given twice in one table "
                                       f"(line {key_node.start_mark.line + 1})")
                seen.add(key)
            return super().construct_mapping(node, deep)  # type: ignore[no-any-return]

    UniqueKeyLoader.yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != _YAML_TIMESTAMP]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))
    return UniqueKeyLoader


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML, JSON or YAML file of at most `MAX_CONFIG_BYTES` into a mapping (by extension)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = read_regular_file(path, MAX_CONFIG_BYTES)  # a FIFO, a device or a huge file: one line, no wait
    except OSError as error:
        raise ConfigError(f"config file {path}: {error.strerror or error}") from None
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json", ".yaml", ".yml"):
        raise ConfigError(f"config file {path}: unknown format {suffix!r}; use .toml, .json, .yaml or .yml")
    import yaml  # only when a config file is read: the command line starts without it

    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark, as some Windows editors write, is no setting
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text, object_pairs_hook=_table_without_repeats)
        else:
            data = yaml.load(text, Loader=_yaml_loader()) or {}  # a SafeLoader, refusing repeated keys
    except _RepeatedKey as error:
        raise ConfigError(f"config file {path}: {error}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as error:
        first_line = (str(error).splitlines() or [type(error).__name__])[0]
        raise ConfigError(f"config file {path} is not valid {suffix[1:].upper()}: {first_line}") from None
    except RecursionError:
        # The parsers recurse once per level of nesting; no setting is nested more than a few levels.
        raise ConfigError(f"config file {path} is nested too deeply to be a morphogen config") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a table of settings at the top level")
    return data


def config_to_dict(config: Any) -> Any:
    """A config dataclass as plain JSON-able values (enums by value), for the run directory."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: config_to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, enum.Enum):
        return config.value
    if isinstance(config, (tuple, list, frozenset, set)):
        items = [config_to_dict(v) for v in config]
        return sorted(items, key=str) if isinstance(config, (frozenset, set)) else items
    return config
