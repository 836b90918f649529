"""Your own objective as an arm: the plugin interface (design section 6).

A plugin is a Python module named in the config (`plugins: [mypkg.losses]`, or a file path such
as `examples/clipped_reinforce.py`). Importing it registers one or more objectives, each as a
pair: an arm model (a subclass of `learner.config.ArmBase` or `GroupArm` whose `objective` is a
one-name `Literal`, whose fields are the settings the loss reads with their defaults, and whose
class variables declare the advantage kind, the critic and the loss units) and a pure loss with
the built-in losses' signature, decorated:

    @register_objective(arm=ClippedReinforceArm)
    def clipped_reinforce_loss(logprobs, old_logprobs, advantages, mask, options, *,
                               is_weights=None, ref_logprobs=None): ...

From then on a plugin arm is an arm like any other: the same matching, metrics, checkpoints,
MLflow logging and report. The loss is checked when it registers: it is called once on a tiny
batch and must return `(scalar loss with a gradient, stats)` with exactly the policy stat keys
every objective reports (`learner.algorithms.objectives.stats.policy_stats` computes them), so a
broken plugin is refused in one line naming it instead of failing in the middle of a trial.

Each trial records the plugins loaded (module, version, sha256 of the source) with its
provenance, and the source digest is part of the config hash, so a finished trial is not taken
for one of a changed plugin.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from contract import metrics as M
from learner.algorithms.objectives import (
    PolicyLoss,
    register_policy_loss,
    unregister_policy_loss,
)
from learner.config import ArmBase, make_arm, objective_of, register_arm, unregister_arm
from learner.config.plugin_records import LOADED, PluginInfo, record_plugin

POLICY_STAT_KEYS = frozenset(
    name.removeprefix("policy/")
    for name in M.ALL_METRICS
    if name.startswith("policy/") and name not in {M.POLICY_ENTROPY, M.POLICY_KL_REF}
)
"""The stats every policy loss returns (`kl_ref` too when given reference logprobs); the
learner logs them as `policy/<key>`."""

_LOSS_PARAMETERS = ("logprobs", "old_logprobs", "advantages", "mask", "options")


class PluginError(ValueError):
    """A plugin that cannot be used; the message is one line naming it."""


_REGISTERING: list[str] = []  # objectives registered by the plugin being imported


def register_objective(arm: type[ArmBase]) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator for a plugin's loss: registers `arm` and the loss under the arm's objective,
    after one call on a tiny batch proves the loss keeps the contract."""

    def register(loss: PolicyLoss) -> PolicyLoss:
        name = _objective_name(arm)
        _check_signature(name, loss)
        try:
            register_arm(arm)
        except ValueError as exc:
            raise PluginError(f"{exc}; choose another name") from None
        register_policy_loss(name, loss)
        try:
            _check_call(name, loss)
        except PluginError:
            unregister_arm(name)
            unregister_policy_loss(name)
            raise
        _REGISTERING.append(name)
        return loss

    return register


def load_plugins(entries: list[str]) -> list[PluginInfo]:
    """Import each plugin once per process (in order) and return what each registered.

    A file entry is keyed by its resolved path, so one file named two ways (relative and
    absolute) is imported once instead of failing as a second registration of its objectives.
    """
    keys = [str(Path(e).resolve()) if e.endswith(".py") else e for e in entries]
    return [LOADED.get(key) or _load(key) for key in keys]


def _load(entry: str) -> PluginInfo:
    _REGISTERING.clear()
    try:
        module = _import(entry)
    except PluginError:
        raise
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise PluginError(
            f"plugin {entry!r} failed to import: {type(exc).__name__}: {reason}"
        ) from exc
    if not _REGISTERING:
        raise PluginError(
            f"plugin {entry!r} registered no objective: decorate its loss with "
            "learner.plugins.register_objective(arm=YourArm)"
        )
    return record_plugin(entry, module, tuple(_REGISTERING))


def _import(entry: str):
    if not entry.endswith(".py"):
        return importlib.import_module(entry)
    path = Path(entry)
    if not path.is_file():
        raise PluginError(f"plugin {entry!r}: no such file")
    name = f"harness_plugin_{path.stem}_{hashlib.sha256(entry.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _objective_name(arm: type[ArmBase]) -> str:
    if not (isinstance(arm, type) and issubclass(arm, ArmBase)):
        raise PluginError(f"register_objective(arm=...) takes an ArmBase subclass, got {arm!r}")
    try:
        return objective_of(arm)
    except TypeError as exc:
        raise PluginError(str(exc)) from None


def _check_signature(name: str, loss: Callable[..., object]) -> None:
    try:
        parameters = inspect.signature(loss).parameters
    except (TypeError, ValueError):
        raise PluginError(f"objective {name!r}: its loss is not a function") from None
    positional = [p.name for p in parameters.values() if p.kind in _POSITIONAL]
    keywords = {p.name for p in parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY}
    if tuple(positional) != _LOSS_PARAMETERS or not {"is_weights", "ref_logprobs"} <= keywords:
        raise PluginError(
            f"objective {name!r}: loss {getattr(loss, '__name__', loss)!r} has parameters "
            f"({', '.join(positional)}; *, {', '.join(sorted(keywords))}); a policy loss takes "
            f"({', '.join(_LOSS_PARAMETERS)}, *, is_weights=None, ref_logprobs=None)"
        )


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _check_call(name: str, loss: PolicyLoss) -> None:
    """One call on two rows of three tokens (one padded): a scalar with a gradient, finite, and
    the standard stats."""
    arm = make_arm(name="plugin-check", objective=name)
    logprobs = torch.tensor([[-1.0, -0.5, -2.0], [-0.7, -1.2, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -0.5, -1.9], [-0.7, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages = torch.tensor([1.0, -1.0]) if arm.advantages == "group" else mask * 0.5
    try:
        result = loss(logprobs, old, advantages, mask, arm.objective_options(max_len=3))
    except Exception as exc:
        raise PluginError(
            f"objective {name!r}: its loss raised {type(exc).__name__} on a 2x3 check batch: {exc}"
        ) from exc
    problem = _result_problem(result)
    if problem:
        raise PluginError(f"objective {name!r}: its loss {problem}")


def _result_problem(result: object) -> str | None:
    if not (isinstance(result, tuple) and len(result) == 2):
        return "must return (loss, stats)"
    value, stats = result
    if not (isinstance(value, torch.Tensor) and value.dim() == 0 and value.requires_grad):
        return "must return a scalar tensor with a gradient as its loss"
    if not torch.isfinite(value):
        return "returned a non-finite loss on a check batch"
    if not isinstance(stats, dict):
        return "must return its stats as a dict of floats"
    missing, extra = POLICY_STAT_KEYS - set(stats), set(stats) - POLICY_STAT_KEYS - {"kl_ref"}
    if missing or extra:
        return (
            f"stats lack {sorted(missing)} and add {sorted(extra)}; return the standard policy "
            "stats (learner.algorithms.objectives.stats.policy_stats)"
        )
    return None
