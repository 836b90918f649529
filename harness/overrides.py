"""Dotted command-line overrides (`learner.lr=1e-5`, `arms.grpo.agg=token-mean`) on a raw config.

Kept apart from the config models: overrides edit the YAML mapping before validation, so every
override is validated exactly like the file it modifies, and errors name the dotted path.
"""

from __future__ import annotations

from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration is invalid; the message names the field path and the bad value."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into a key path and a YAML-parsed value (`lr=1e-5` -> float)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like `section.field=value`")
    key, raw = text.split("=", 1)
    path = [part for part in key.strip().split(".") if part]
    if not path:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {exc}") from exc
    return path, _number_if_numeric(value)


def _number_if_numeric(value: Any) -> Any:
    """YAML 1.1 reads `1e-5` (no dot) as a string; a user typing it means a number."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted overrides to a raw config dict; list items by index or by arm name."""
    for text in overrides:
        path, value = parse_override(text)
        node: Any = data
        for depth, part in enumerate(path[:-1]):
            node = _child(node, part, path[: depth + 1], create=True)
        last = path[-1]
        if isinstance(node, list):
            node[_list_index(node, last, path)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(f"override {'.'.join(path)}: {'.'.join(path[:-1])} is not a section")
    return data


def _child(node: Any, part: str, so_far: list[str], create: bool) -> Any:
    if isinstance(node, dict):
        if part not in node and create:
            node[part] = {}
        return node[part]
    if isinstance(node, list):
        return node[_list_index(node, part, so_far)]
    raise ConfigError(f"override {'.'.join(so_far)}: {'.'.join(so_far[:-1])} is not a section")


def _list_index(items: list[Any], part: str, so_far: list[str]) -> int:
    if part.isdigit() and int(part) < len(items):
        return int(part)
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("name") == part:
            return index
    raise ConfigError(f"override {'.'.join(so_far)}: no list item {part!r}")
