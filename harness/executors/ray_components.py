"""A trial's learner and generators as Ray actors, in one placement group per trial.

Why an actor that runs the existing component command (`python -m harness.cli learner ...`)
instead of calling the mains in-process: the actor holds the very `Child` the local supervisor
would hold, so logs, pid files, exit codes and teardown are the local ones, on whichever node
Ray chose. Lifetimes nest, so nothing is orphaned: the component process gets SIGTERM when its
actor's worker dies (PR_SET_PDEATHSIG), the actors and the placement group belong to the trial's
supervisor (a Ray driver) and die with it.

Bundle 0 is the learner's, bundle 1 + i generator i's (`executor.learner`/`executor.generator`),
so a trial starts with all of its resources or waits for them. An actor that dies under a
running component (its node died, or its worker was killed) reads as an exit with
EXIT_NO_RESTART and a last line starting `error: node lost`: the supervisor fails the trial at
once instead of restarting a generator into a bundle that no longer exists, and the executor
(`harness.executors.ray.RayTrialPool`) starts the trial again, resuming from its checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from contract.layout import LOGS_DIR, TRIAL_JSON
from harness.config.executor import ComponentResources, ExecutorConfig
from harness.executors.base import NODE_LOST, TrialFailedError
from harness.executors.gcs_address import host_and_port
from harness.launch.processes import EXIT_NO_RESTART, Child
from harness.signals import SignalLatch
from harness.storage.setup import setup_host_copy
from harness.storage.trial_storage import SUPERVISOR_INPUTS, TrialSync

NAMESPACE = "gspo-harness"
POLL_TIMEOUT_S = 10.0  # one poll of a busy node; a timeout reads as "still running"
RESERVE_CHECK_S = 1.0  # how often a trial waiting for its placement group checks for Ctrl-C
TEARDOWN_S = 15.0  # leaving Ray takes well under a second while its GCS answers
GCS_PROBE_S = 2.0  # a live GCS accepts a connection at once, even on a loaded machine
_ABANDONED = False


def connect(address: str | None) -> None:
    """Join the cluster as a driver: `address`, else $RAY_ADDRESS (what `harness run` sets),
    else the Ray instance `ray start` left on this machine. Usage stats stay off."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address=address or "auto",
        namespace=NAMESPACE,
        log_to_driver=False,  # components log to the trial's logs/, not to the supervisor
        logging_level=logging.WARNING,
    )


def bundle_index(name: str) -> int:
    """`learner` -> 0, `generator-<i>` -> 1 + i (the supervisor's component names)."""
    if name == "learner":
        return 0
    prefix = "generator-"
    if name.startswith(prefix) and name[len(prefix) :].isdigit():
        return 1 + int(name[len(prefix) :])
    raise ValueError(f"no placement bundle for component {name!r}")


class ComponentHost:
    """Runs one component's command on the node Ray placed this actor on.

    Trial output in a bucket (the supervisor's env names it): the component works in a private
    copy of the trial directory on this node; its arguments and log are pointed there, the
    supervisor's files are pulled before each start, and its log is pushed now and then.
    """

    def __init__(self, name: str, args: list[str], log_path: str, env: dict[str, str]) -> None:
        node = ray.get_runtime_context().get_node_id()[:12]
        copy = setup_host_copy(env, name, node)
        self._sync: TrialSync | None = None
        if copy is not None:
            driver_root = str(Path(log_path).parent.parent)
            args = [_rebase(arg, driver_root, str(copy.root)) for arg in args]
            log_path = str(copy.paths.component_log(name))
            self._sync = copy.sync
        self._child = Child(name, list(args), Path(log_path), dict(env))
        self._log = f"{LOGS_DIR}/{Path(log_path).name}"

    def start(self) -> tuple[str, str]:
        """Start (or restart) the component; returns (node id, node IP) for the trial log."""
        node = ray.get_runtime_context().get_node_id()
        ip = ray.util.get_node_ip_address()
        trial_dir = self._child.log_path.parent.parent
        if self._sync is not None:
            self._sync.pull(SUPERVISOR_INPUTS, delete=False)
        if not (trial_dir / TRIAL_JSON).is_file():
            raise RuntimeError(
                f"the trial directory {trial_dir} is not visible on Ray node {ip}: trial output "
                "must live on storage every node mounts at the same path (README, Ray)"
            )
        if not Path(self._child.args[0]).is_file():
            raise RuntimeError(
                f"{self._child.args[0]} does not exist on Ray node {ip}: install the project "
                "at the same path on every node (one image, or one shared virtual environment)"
            )
        self._child.start()
        return node, ip

    def poll(self) -> int | None:
        code = self._child.poll()
        self._push_log(now=code is not None)
        return code

    def stop(self, timeout_s: float) -> None:
        self._child.stop(timeout_s)
        self._push_log(now=True)

    def _push_log(self, now: bool) -> None:
        """The log to the bucket (best effort: the supervisor asks this actor for its tail)."""
        if self._sync is None:
            return
        with contextlib.suppress(OSError):
            if now:
                self._sync.push([self._log])
            else:
                self._sync.push_now_and_then([self._log])

    def last_line(self) -> str:
        return self._child.last_line()

    def tail(self, lines: int) -> str:
        return self._child.tail(lines)


def _rebase(arg: str, old_root: str, new_root: str) -> str:
    """A path under the supervisor's trial directory, moved under this node's working copy."""
    if arg == old_root or arg.startswith(old_root + "/"):
        return new_root + arg[len(old_root) :]
    return arg


_RemoteHost = ray.remote(max_restarts=0, max_task_retries=0)(ComponentHost)


def _first_line(exc: BaseException) -> str:
    cause = exc.cause if isinstance(exc, RayTaskError) else exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"


class RayChild:
    """One component in its actor; the interface of `processes.Child` for the supervisor."""

    def __init__(
        self,
        launcher: RayLauncher,
        name: str,
        args: list[str],
        log_path: Path,
        env: dict[str, str],
    ) -> None:
        self.name = name
        self.bundle = bundle_index(name)
        self._launcher = launcher
        self._local = Child(name, args, log_path, env)  # reads the log on shared storage
        # Created now, not at start: Ray starts the worker processes of all of a trial's
        # actors at once, while the supervisor starts its components one after the other.
        self._actor: Any = launcher.host(self.bundle, self._local)
        self.lost: str | None = None

    def start(self) -> None:
        """Start the component in its actor (a new actor if `stop` removed the old one)."""
        self.lost = None
        # the supervisor's copy of the log, read when the actor cannot answer: this attempt's
        # lines only, as the actor's own Child reads them (processes.Child.log_start)
        try:
            self._local.log_start = self._local.log_path.stat().st_size
        except OSError:
            self._local.log_start = 0
        if self._actor is None:
            self._actor = self._launcher.host(self.bundle, self._local)
        timeout = self._launcher.executor.start_timeout_s
        try:
            node, ip = ray.get(self._actor.start.remote(), timeout=timeout)
        except ActorDiedError as exc:
            self._lose(exc)
            return
        except GetTimeoutError:
            raise TrialFailedError(
                f"{self.name} did not start within executor.start_timeout_s={timeout:g} s on "
                "its Ray node; raise it, or check the node's raylet log"
            ) from None
        except RayTaskError as exc:
            raise TrialFailedError(f"{self.name} could not start: {_first_line(exc)}") from None
        print(f"{self.name}: started on Ray node {node} ({ip})", flush=True)

    def poll(self) -> int | None:
        if self.lost is not None:
            return EXIT_NO_RESTART
        if self._actor is None:
            return None
        try:
            return ray.get(self._actor.poll.remote(), timeout=POLL_TIMEOUT_S)
        except ActorDiedError as exc:
            self._lose(exc)
            return EXIT_NO_RESTART
        except (GetTimeoutError, RayActorError):  # busy or briefly unreachable: ask again
            return None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the component (SIGTERM, then SIGKILL), then the actor; never raises."""
        actor, self._actor = self._actor, None
        if actor is None:
            return
        with contextlib.suppress(Exception):  # a dead actor: its component died with it
            ray.get(actor.stop.remote(timeout_s), timeout=timeout_s + POLL_TIMEOUT_S)
        with contextlib.suppress(Exception):
            ray.kill(actor)

    def last_line(self) -> str:
        if self.lost is not None:
            return f"error: {self.lost}"
        return self._ask("last_line") or self._local.last_line()

    def tail(self, lines: int = 20) -> str:
        return self._ask("tail", lines) or self._local.tail(lines)

    def _ask(self, method: str, *args: Any) -> str | None:
        """The component's log as its node sees it (a private working copy, or a mount that
        lags); None when the actor is gone, and the supervisor's copy is all there is."""
        if self._actor is None:
            return None
        with contextlib.suppress(Exception):
            return ray.get(getattr(self._actor, method).remote(*args), timeout=POLL_TIMEOUT_S)
        return None

    def _lose(self, exc: BaseException) -> None:
        self._actor = None
        self.lost = f"{NODE_LOST}: {self.name}'s Ray actor died ({_first_line(exc)})"
        print(f"{self.name}: {self.lost}", flush=True)


def _leave_ray(group: PlacementGroup | None) -> None:
    if group is not None:
        with contextlib.suppress(Exception):
            remove_placement_group(group)
    ray.shutdown()


def _gcs_refuses_connections() -> bool:
    """True when nothing listens at the GCS address this driver joined any more: the private
    Ray instance of a killed `harness run` is gone, and leaving it cannot succeed (Ray would
    retry for a minute). Anything else (it answers, a timeout, an unknown address) is False:
    the teardown is tried as usual. Placement groups this driver made go with its job anyway."""
    try:
        where = host_and_port(ray.get_runtime_context().gcs_address)
    except (AttributeError, RuntimeError):
        return False
    if where is None:
        return False
    try:
        with socket.create_connection(where, timeout=GCS_PROBE_S):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def ray_abandoned() -> bool:
    """A RayLauncher gave up on Ray's teardown: exit with os._exit, not through Ray's hooks."""
    return _ABANDONED


class RayLauncher:
    """Connect to Ray for one trial, reserve its placement group, make its component actors."""

    def __init__(
        self, executor: ExecutorConfig, num_generators: int, interrupted: SignalLatch
    ) -> None:
        self.executor = executor
        self.num_generators = num_generators
        self.redis_host = ""
        self._interrupted = interrupted
        self._group: PlacementGroup | None = None

    def bundles(self) -> list[dict[str, float]]:
        gens: list[ComponentResources] = [self.executor.generator] * self.num_generators
        return [self.executor.learner.bundle(), *(g.bundle() for g in gens)]

    def __enter__(self) -> RayLauncher:
        try:
            connect(self.executor.address)
        except (ConnectionError, RuntimeError) as exc:
            where = self.executor.address or os.environ.get("RAY_ADDRESS") or "auto"
            raise TrialFailedError(f"cannot join the Ray cluster at {where}: {exc}") from None
        self.redis_host = ray.util.get_node_ip_address()  # routable: the other nodes dial it
        return self

    def __exit__(self, *exc: object) -> None:
        """Give back the placement group and leave Ray, waiting at most TEARDOWN_S for it.

        Both are calls to the GCS. When it is gone (a private Ray instance dies with a killed
        `harness run`), Ray retries until it ends the process itself a minute later; the trial
        is recorded by then, so the supervisor does not wait (its port refuses connections) or
        stops waiting, says so, and the trial command exits without Ray's own exit hooks
        (`ray_abandoned`).
        """
        global _ABANDONED  # noqa: PLW0603 - one process, one Ray connection
        group, self._group = self._group, None
        if _gcs_refuses_connections():  # known gone: no need to wait TEARDOWN_S to learn it
            _ABANDONED = True
            print("Ray's GCS refuses connections (its Ray instance is gone); "
                  "leaving without Ray's teardown", flush=True)  # fmt: skip
            return
        teardown = threading.Thread(target=_leave_ray, args=(group,), daemon=True)
        teardown.start()
        teardown.join(TEARDOWN_S)
        if teardown.is_alive():
            _ABANDONED = True
            print(f"Ray did not answer within {TEARDOWN_S:g} s (its GCS is gone?); "
                  "leaving without Ray's teardown", flush=True)  # fmt: skip

    def child(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> RayChild:
        return RayChild(self, name, args, log_path, env)

    def host(self, bundle: int, child: Child) -> Any:
        """The actor for `child` in bundle `bundle` of the trial's placement group."""
        group = self._reserve()
        resources = self.bundles()[bundle]
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
        return _RemoteHost.options(
            num_cpus=resources.get("CPU", 0),
            num_gpus=resources.get("GPU", 0),
            resources=custom,
            scheduling_strategy=strategy,
        ).remote(child.name, child.args, str(child.log_path), child.env)

    def _reserve(self) -> PlacementGroup:
        """The trial's placement group, waiting until Ray grants all of it (or Ctrl-C)."""
        if self._group is not None:
            return self._group
        bundles = self.bundles()
        self._group = placement_group(bundles, strategy=self.executor.placement_strategy)
        said = False
        while not self._group.wait(timeout_seconds=RESERVE_CHECK_S):
            if self._interrupted.caught:
                raise TrialFailedError("interrupted while waiting for Ray resources")
            if not said:
                print(f"waiting for Ray resources: bundles {bundles}", file=sys.stdout, flush=True)
                said = True
        return self._group
