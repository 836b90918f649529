"""What this process's plugins are: module, version and source digest (no torch).

`learner.plugins` imports plugins (and torch) and records each here; trial provenance and the
config hash read the records without importing torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from contract.durable import file_digest


@dataclass(frozen=True)
class PluginInfo:
    """What a trial records about one loaded plugin."""

    entry: str
    """As the config names it: a module, or an absolute file path."""
    module: str
    version: str
    """The installed distribution's version, else the module's `__version__`, else `unknown`."""
    source_sha256: str
    """Of the module's source (every `.py` file of a package, in path order)."""
    objectives: tuple[str, ...]
    """The objectives it registered."""


LOADED: dict[str, PluginInfo] = {}
"""entry -> its record, for every plugin this process imported."""


def record_plugin(entry: str, module: object, objectives: tuple[str, ...]) -> PluginInfo:
    """Record an imported plugin (its version and the digest of its source)."""
    info = PluginInfo(
        entry=entry,
        module=getattr(module, "__name__", entry),
        version=_version(module),
        source_sha256=_source_digest(module),
        objectives=objectives,
    )
    LOADED[entry] = info
    return info


def loaded_plugins() -> list[dict[str, object]]:
    """The plugins this process loaded, as trial provenance records them."""
    return [asdict(info) for info in LOADED.values()]


def plugin_digests(entries: list[str]) -> dict[str, str]:
    """entry -> source sha256 of loaded plugins (part of the config hash); an entry not loaded
    in this process is an error (the config that names it loads it when validated)."""
    missing = [entry for entry in entries if entry not in LOADED]
    if missing:
        raise ValueError(f"plugins {missing} are not loaded; validate the config first")
    return {entry: LOADED[entry].source_sha256 for entry in entries}


def _version(module: object) -> str:
    top = getattr(module, "__name__", "").split(".")[0]
    packages = metadata.packages_distributions().get(top, [])
    if packages:
        return metadata.version(packages[0])
    return str(getattr(module, "__version__", "unknown"))


def _source_digest(module: object) -> str:
    origin = Path(getattr(module, "__file__", "") or "")
    files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
    return file_digest([path for path in files if path.is_file()])
