"""Settings from a TOML file, environment variables and flags, in that order of
precedence (flag > environment > file > default), for any of the components' config
dataclasses. The same metadata generates the configuration reference in docs/configuration.md
(`gpufleet config reference`).

    /etc/gpufleet/gpufleet.toml (or --config FILE, or $GPUFLEET_CONFIG):
        [collector]
        interval_s = 2.0
    environment: GPUFLEET_COLLECTOR_INTERVAL_S=2
    flag:        gpufleet collector run --interval-s 2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
DEFAULT_CONFIG_FILE = Path("/etc/gpufleet/gpufleet.toml")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A setting has a bad value; the message names it, where it came from and the fix."""


def env_name(section: str, name: str) -> str:
    return f"GPUFLEET_{section.upper()}_{name.upper()}"


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, cls: type, section: str) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        help_text = f"{f.metadata.get('help', '')} [env {env_name(section, f.name)}]"
        if hints[f.name] is bool:
            parser.add_argument(
                flag_name(f.name),
                dest=f.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag_name(f.name),
                dest=f.name,
                default=None,
                metavar=hints[f.name].__name__.upper(),
                help=help_text,
            )


def _convert(kind: type, raw: Any, origin: str) -> Any:
    if isinstance(raw, str) and kind is not str:
        text = raw.strip().lower()
        if kind is bool:
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ConfigError(f"{origin}={raw!r} is not a boolean; use true or false")
        try:
            return kind(raw)
        except ValueError:
            raise ConfigError(f"{origin}={raw!r} is not a valid {kind.__name__}") from None
    if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if not isinstance(raw, kind) or (kind is int and isinstance(raw, bool)):
        raise ConfigError(f"{origin}={raw!r} must be a {kind.__name__}")
    return raw


def load_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def config_path(explicit: str | None, env: Mapping[str, str]) -> Path | None:
    if explicit:
        return Path(explicit)
    if env.get("GPUFLEET_CONFIG"):
        return Path(env["GPUFLEET_CONFIG"])
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.exists() else None


def resolve(
    cls: type[T],
    section: str,
    flags: argparse.Namespace | None,
    env: Mapping[str, str] = os.environ,
    file_data: Mapping[str, Any] | None = None,
    file_label: str = "config file",
) -> T:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    from_file = dict((file_data or {}).get(section, {}))
    unknown = set(from_file) - known
    if unknown:
        raise ConfigError(
            f"{file_label}: unknown setting(s) {', '.join(sorted(unknown))} in [{section}]; "
            f"known: {', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        flag_value = getattr(flags, f.name, None) if flags is not None else None
        if flag_value is not None:
            values[f.name] = _convert(hints[f.name], flag_value, flag_name(f.name))
        elif env_name(section, f.name) in env:
            values[f.name] = _convert(
                hints[f.name], env[env_name(section, f.name)], env_name(section, f.name)
            )
        elif f.name in from_file:
            values[f.name] = _convert(hints[f.name], from_file[f.name], f"{file_label} [{section}] {f.name}")
    try:
        return cls(**values)
    except ValueError as exc:
        raise ConfigError(f"{section}: {exc}") from exc


def reference(sections: Mapping[str, type]) -> str:
    """A Markdown table of every setting: name, environment variable, default, meaning. A
    plug-in's own settings (common/registry.py) follow in a table of their own, under the
    choice that uses them ("repair_backend = slurm")."""
    lines = []
    for section, cls in sections.items():
        hints = typing.get_type_hints(cls)
        groups: dict[str, list[dataclasses.Field[Any]]] = {}
        for f in dataclasses.fields(cls):
            owner = next(k for k in cls.__mro__ if f.name in vars(k).get("__annotations__", {}))
            groups.setdefault(vars(owner).get("chosen_by", ""), []).append(f)
        for chosen_by, fields in sorted(groups.items(), key=lambda g: g[0] != ""):
            title = f"### `[{section}]`" if not chosen_by else f"#### `[{section}]`, with {chosen_by}"
            lines += [
                title,
                "",
                "| setting | flag / environment | type | default | meaning |",
                "|---|---|---|---|---|",
            ]
            for f in fields:
                default = "(hostname)" if f.name == "node" else repr(f.default)
                lines.append(
                    f"| `{f.name}` | `{flag_name(f.name)}` / `{env_name(section, f.name)}` | "
                    f"{hints[f.name].__name__} | `{default}` | {f.metadata.get('help', '')} |"
                )
            lines.append("")
    return "\n".join(lines)


def check_file(path: str, sections: Mapping[str, type], as_json: bool = False) -> int:
    """`gpufleet config check FILE`: each of the file's sections resolved as its component does
    at start (the file alone: no flags, no environment), with the same messages; 0 when every
    section is usable, 2 (the exit code for bad configuration) when one is not."""
    import json

    label = f"config file {path}"
    results: dict[str, str] = {}
    try:
        data = load_file(Path(path))
    except ConfigError as exc:
        results["file"] = str(exc)
    else:
        for name in sorted(set(data) - set(sections)):
            results[name] = (
                f"{label}: unknown section [{name}]; known: {', '.join(f'[{s}]' for s in sections)}"
            )
        for section, cls in sections.items():
            if section not in data:
                continue
            try:
                resolve(cls, section, None, {}, data, label)
                results[section] = ""
            except ConfigError as exc:
                results[section] = str(exc)
        if not results:
            results["file"] = f"{label} has none of the sections {', '.join(f'[{s}]' for s in sections)}"
    ok = not any(results.values())
    if as_json:
        print(json.dumps({"file": path, "ok": ok, "sections": {k: v or "ok" for k, v in results.items()}}))
    else:
        for section, problem in results.items():
            print(f"[{section}] ok" if not problem else f"[{section}] {problem}")
        print(f"{path}: {'usable' if ok else 'NOT usable: fix the lines above'}")
    return 0 if ok else 2
