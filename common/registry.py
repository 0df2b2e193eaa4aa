"""One shape for every kind of plug-in (cordon backends, alert sinks, history stores, collector
event sources, health rules, inference-engine parsers): a registry of name -> plug-in, each
plug-in naming itself (`name`) and saying in one line what it is (`help`). The setting that
chooses one, its help and the error for a name that is none are derived from the registry.

A plug-in that takes settings declares them itself, as a dataclass of `setting()` fields with a
`check_settings(settings, chosen)` class method (common/settings.py); the aggregator's settings
include those dataclasses (aggregator/settings/), so the settings reference, the file, the
environment and the flags list them with no table kept by hand."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    name: str


P = TypeVar("P", bound=Named)


class UnknownPlugin(ValueError):
    """A name that is no plug-in of the registry; the message names the setting and the choices."""


class Registry(Generic[P]):
    def __init__(self, setting: str, plugins: Iterable[P]) -> None:
        self.setting = setting  # the setting (or policy key) that chooses one, for errors
        self._plugins: dict[str, P] = {}
        for plugin in plugins:
            if not plugin.name or plugin.name in self._plugins:
                raise ValueError(f"{setting}: plug-in {plugin!r} has no name or one already taken")
            self._plugins[plugin.name] = plugin

    def __getitem__(self, name: str) -> P:
        try:
            return self._plugins[name]
        except KeyError:
            raise UnknownPlugin(f"{self.setting}={name!r}: use one of {self.described()}") from None

    def get(self, name: str) -> P | None:
        return self._plugins.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._plugins

    def __iter__(self) -> Iterator[str]:
        return iter(self._plugins)

    def __len__(self) -> int:
        return len(self._plugins)

    def items(self) -> Iterable[tuple[str, P]]:
        return self._plugins.items()

    def values(self) -> Iterable[P]:
        return self._plugins.values()

    def described(self) -> str:
        """ "none (gpufleet's own records), slurm (scontrol), ...": for help and errors."""
        return ", ".join(
            f"{name} ({help_})" if (help_ := getattr(plugin, "help", "")) else name
            for name, plugin in self._plugins.items()
        )

    def settings_classes(self) -> tuple[type, ...]:
        """The settings dataclasses the plug-ins declare (each once), for the settings to include."""
        out: list[type] = []
        for plugin in self._plugins.values():
            cls = getattr(plugin, "settings", None)
            if cls is not None and cls not in out:
                out.append(cls)
        return tuple(out)

    def check_settings(self, settings: object, chosen: Iterable[str] = ()) -> None:
        """Each plug-in checks its own settings (ValueError naming the setting); `chosen`: the
        plug-ins the settings select (a plug-in's settings may be required only then)."""
        wanted = set(chosen)
        for name, plugin in self._plugins.items():
            check = getattr(plugin, "check_settings", None)
            if check is not None:
                check(settings, name in wanted)
