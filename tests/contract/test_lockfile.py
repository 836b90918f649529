"""The dependency locks (harness.lockfile): they answer pyproject.toml, pin every requirement of
their extras, and the venv the suite runs in is exactly the lock it was installed from."""

from __future__ import annotations

import platform
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from harness.lockfile import (
    BUILD_TOOLS,
    LOCK_DIR,
    LOCK_EXTRAS,
    PYPROJECT,
    applicable_pins,
    canonical_name,
    dependency_digest,
    installed_versions,
    lock_entry,
    read_pins,
    recorded_digest,
    stale_lock_message,
    stamp,
    uv_source_args,
    venv_differences,
)

LOCKS = [LOCK_DIR / f"{name}.txt" for name in LOCK_EXTRAS]
LOCKED_PLATFORM = (
    sys.implementation.name == "cpython"
    and sys.version_info[:2] == (3, 11)
    and platform.system() == "Linux"
    and platform.machine() == "x86_64"
)


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_each_lock_answers_pyproject(lock: Path) -> None:
    """CI fails here (and setup.sh before it) when pyproject.toml's dependencies change
    without `bash scripts/lock.sh`."""
    assert stale_lock_message(lock) is None, stale_lock_message(lock)


@pytest.mark.parametrize("name", list(LOCK_EXTRAS))
def test_each_lock_pins_every_requirement_of_its_extras_within_its_range(name: str) -> None:
    """Beyond the digest: every direct requirement (dependencies, the lock's extras, the build
    tools) has a pin, and the pinned version is inside the declared range."""
    pins = read_pins(LOCK_DIR / f"{name}.txt")
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    declared = list(project["dependencies"])
    for extra in LOCK_EXTRAS[name]:
        declared += project["optional-dependencies"][extra]
    declared += [line for line in BUILD_TOOLS.read_text().splitlines() if line[:1].isalnum()]
    for text in declared:
        requirement = Requirement(text)
        pin = pins.get(canonical_name(requirement.name))
        assert pin is not None, f"{requirement.name} is not in {name}.txt"
        assert requirement.specifier.contains(pin.version, prereleases=True), (text, pin)


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_every_pin_carries_its_files_hashes(lock: Path) -> None:
    """`pip install --require-hashes` refuses a pin without one: every pin line goes on to at
    least one sha256 line."""
    lines = lock.read_text().splitlines()
    pinned = [i for i, line in enumerate(lines) if line[:1].isalnum() and "==" in line]
    assert len(pinned) == len(read_pins(lock)) > 100
    for i in pinned:
        assert lines[i].endswith("\\") and lines[i + 1].strip().startswith("--hash=sha256:"), i


def test_pins_parse_names_with_extras_and_markers(tmp_path: Path) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text(
        "redis[hiredis]==8.2.0 \\\n    --hash=sha256:00\n"
        "Typing_Extensions==4.16.0 \\\n    --hash=sha256:11\n"
        'async-timeout==5.0.1 ; python_full_version < "3.11.3" \\\n    --hash=sha256:22\n'
        "    # via redis\n"
    )
    pins = read_pins(lock)
    assert set(pins) == {"redis", "typing-extensions", "async-timeout"}
    assert pins["redis"].version == "8.2.0" and pins["redis"].marker is None
    assert pins["async-timeout"].marker == 'python_full_version < "3.11.3"'
    # The marker decides: on 3.11.3 and later async-timeout is not wanted.
    wanted = applicable_pins(pins)
    assert ("async-timeout" in wanted) == (sys.version_info < (3, 11, 3))


def test_a_lock_entry_is_one_package_with_all_its_hashes(tmp_path: Path) -> None:
    """What setup.sh hands pip to install uv by hash: the pin and every hash line, nothing of
    the next package; a package the lock lacks is an error, not an empty file."""
    lock = tmp_path / "lock.txt"
    lock.write_text(
        "Typing_Extensions==4.16.0 \\\n    --hash=sha256:11\n"
        "uv==0.13.9 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via gspo-harness\n"
        "wheel==0.48.0 \\\n    --hash=sha256:cc\n"
    )
    uv_entry = "uv==0.13.9 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n"
    assert lock_entry(lock, "uv") == uv_entry
    assert lock_entry(lock, "typing-extensions").startswith("Typing_Extensions==4.16.0")
    with pytest.raises(KeyError, match="numpy"):
        lock_entry(lock, "numpy")
    # the real lock pins uv (the dev extra) with its hashes
    entry = lock_entry(LOCKS[0], "uv")
    assert entry.startswith(f"uv=={read_pins(LOCKS[0])['uv'].version} ")
    assert entry.count("--hash=sha256:") >= 1 and not entry.rstrip().endswith("\\")


def test_uv_gets_the_sources_pip_is_configured_with() -> None:
    """uv reads no pip configuration: `pip config list` is translated, the environment
    overriding the install section overriding global, as in pip; lists split on whitespace."""
    listed = "\n".join(
        [
            "global.cert='/etc/ssl/certs/ca-certificates.crt'",
            "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
            "global.find-links='/opt/global-wheels'",
            "install.find-links='/opt/install-wheels'",
            ":env:.find-links='/opt/wheels'",
            "global.index-url='https://mirror.example/simple'",
            "global.timeout='60'",
        ]
    )
    assert uv_source_args(listed) == [
        "--index-url",
        "https://mirror.example/simple",
        "--extra-index-url",
        "file:///opt/pypi/simple",
        "--extra-index-url",
        "file:///opt/pypi-more/simple",
        "--find-links",
        "/opt/wheels",
    ]
    assert uv_source_args("") == []
    assert uv_source_args("global.no-index='true'\nglobal.find-links='/w'") == [
        "--find-links",
        "/w",
        "--no-index",
    ]


def test_a_changed_requirement_makes_the_lock_stale(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    lock = tmp_path / "cpu.txt"
    pyproject.write_text(PYPROJECT.read_text())
    lock.write_text("rich==14.0.0 \\\n    --hash=sha256:00\n")
    stamp(lock, dependency_digest(pyproject))
    assert recorded_digest(lock) == dependency_digest(pyproject)
    assert stale_lock_message(lock, pyproject) is None
    # Formatting and tool sections do not matter; a requirement does.
    pyproject.write_text(pyproject.read_text() + "\n[tool.extra]\nx = 1\n")
    assert stale_lock_message(lock, pyproject) is None
    pyproject.write_text(pyproject.read_text().replace('"rich>=13"', '"rich>=13.1"'))
    message = stale_lock_message(lock, pyproject)
    assert message is not None and "bash scripts/lock.sh" in message


def test_venv_differences_name_each_departure() -> None:
    pins = read_pins(LOCKS[0])
    some = dict(list(applicable_pins(pins).items())[:3])
    installed = dict(some)
    first, second, _ = some
    installed[first] = "0.0.1"
    del installed[second]
    installed["stray"] = "1.0"
    differences = venv_differences({k: pins[k] for k in some}, installed)
    assert differences == sorted(differences)
    assert f"{first}: 0.0.1 installed, locked {some[first]}" in differences
    assert f"{second}: locked {some[second]}, not installed" in differences
    assert "stray: 1.0 installed, not in the lock" in differences


@pytest.mark.skipif(not LOCKED_PLATFORM, reason="the locks are for CPython 3.11, x86-64 Linux")
def test_the_venv_is_exactly_the_cpu_lock() -> None:
    """`pip freeze --all` of the suite's venv equals locks/cpu.txt (setup.sh installs it with
    --no-deps --require-hashes and removes anything else). Skipped only where the lock does not
    apply; set GSPO_UNLOCKED=1 for setup.sh to install unlocked there."""
    assert venv_differences(read_pins(LOCKS[0]), installed_versions()) == []
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    frozen = {canonical_name(line.split("==")[0]): line.split("==")[1] for line in freeze}
    assert frozen == applicable_pins(read_pins(LOCKS[0]))


@pytest.mark.parametrize("flavour", list(LOCK_EXTRAS))
def test_each_docker_image_installs_its_lock_and_every_package(flavour: str) -> None:
    """The images install what setup.sh installs: the lock, by hash, nothing more, then the
    project without dependencies, and check the result equals the lock. Every top-level package
    the project ships is copied in (the CPU image once lacked contract/)."""
    dockerfile = (PYPROJECT.parent / "docker" / f"Dockerfile.{flavour}").read_text()
    assert "COPY locks ./locks" in dockerfile
    assert "--no-deps --require-hashes" in dockerfile and f"-r locks/{flavour}.txt" in dockerfile
    assert "pip install --no-deps --no-build-isolation ." in dockerfile
    assert f"harness/lockfile.py venv locks/{flavour}.txt" in dockerfile
    find = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["packages"]["find"]
    for pattern in find["include"]:
        package = pattern.rstrip("*")
        assert f"COPY {package} ./{package}" in dockerfile, package
