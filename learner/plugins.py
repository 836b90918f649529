"""Your own objective as an arm: the plugin interface (design section 6).

A plugin is a Python module named in the config (`plugins: [mypkg.losses]`, or a file path such
as `examples/clipped_reinforce.py`). Importing it registers one or more objectives, each as a
pair: an arm model (a subclass of `learner.config.ArmBase` or `GroupArm` whose `objective` is a
one-name `Literal`, whose fields are the settings the objective reads with their defaults, and
whose class variables declare the advantage kind, the critic and the loss units) and a pure
objective of the built-in ones' shape, decorated:

    @register_objective(arm=ClippedReinforceArm)
    def clipped_reinforce_loss(batch: PolicyBatch, settings: ClippedReinforceArm) -> PolicyTerms:
        ...  # per-token terms and stats: return policy_terms(batch, settings, terms, ...)

The objective reads the checked batch and its arm and returns its loss terms, not aggregated,
with its stats (`learner.algorithms.objectives.policy_terms`); the learner's reducer aggregates
them with the whole minibatch's totals and computes the standard policy metrics, so a plugin
splits over micro-batches and ranks like a built-in objective. From then on a plugin arm is an
arm like any other: the same matching, metrics, checkpoints, MLflow logging and report. The
objective is checked when it registers: it is called once on a tiny batch and must return
`PolicyTerms` of the batch's shapes whose loss is a finite scalar with a gradient, so a broken
plugin is refused in one line naming it instead of failing in the middle of a trial.

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
from typing import Any

import torch

from learner.algorithms.objectives import (
    LossTerms,
    PolicyBatch,
    PolicyObjective,
    PolicyStats,
    PolicyTerms,
    reduce_loss,
    register_policy_loss,
    unregister_policy_loss,
)
from learner.config import ArmBase, make_arm, objective_of, register_arm, unregister_arm
from learner.config.plugin_records import LOADED, PluginInfo, record_plugin

_PARAMETERS = ("batch", "settings")


class PluginError(ValueError):
    """A plugin that cannot be used; the message is one line naming it."""


_REGISTERING: list[str] = []  # objectives registered by the plugin being imported


Objective = PolicyObjective | Callable[[PolicyBatch, Any], PolicyTerms]


def register_objective(arm: type[ArmBase]) -> Callable[[Objective], PolicyObjective]:
    """Decorator for a plugin's objective, a function (batch, settings) -> PolicyTerms (or a
    `PolicyObjective`, for one that selects tokens): registers `arm` and the objective under the
    arm's objective name, after one call on a tiny batch proves it keeps the contract."""

    def register(objective: Objective) -> PolicyObjective:
        name = _objective_name(arm)
        _check_signature(name, objective)
        loss = objective if isinstance(objective, PolicyObjective) else PolicyObjective(objective)
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


def _check_signature(name: str, objective: Objective) -> None:
    core = objective.core if isinstance(objective, PolicyObjective) else objective
    try:
        parameters = inspect.signature(core).parameters
    except (TypeError, ValueError):
        raise PluginError(f"objective {name!r}: its loss is not a function") from None
    positional = [p.name for p in parameters.values() if p.kind in _POSITIONAL]
    if tuple(positional) != _PARAMETERS or len(parameters) != len(_PARAMETERS):
        listed = ", ".join(str(p) for p in parameters.values())
        raise PluginError(
            f"objective {name!r}: loss {getattr(core, '__name__', core)!r} has parameters "
            f"({listed}); an objective takes ({', '.join(_PARAMETERS)}) and returns PolicyTerms"
        )


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _check_call(name: str, objective: PolicyObjective) -> None:
    """One call on two rows of three tokens (one padded): terms and stats of the batch's
    shapes, reduced to a finite scalar with a gradient."""
    arm = make_arm(name="plugin-check", objective=name)
    logprobs = torch.tensor([[-1.0, -0.5, -2.0], [-0.7, -1.2, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -0.5, -1.9], [-0.7, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages = torch.tensor([1.0, -1.0]) if arm.advantages == "group" else mask * 0.5
    batch = PolicyBatch.of(logprobs, old, advantages, mask)
    try:
        terms = objective(batch, arm)
        problem = _terms_problem(terms, batch) or _loss_problem(terms, batch)
    except Exception as exc:
        raise PluginError(
            f"objective {name!r}: its loss raised {type(exc).__name__} on a 2x3 check batch: {exc}"
        ) from exc
    if problem:
        raise PluginError(f"objective {name!r}: its loss {problem}")


def _terms_problem(terms: object, batch: PolicyBatch) -> str | None:
    """What is wrong with an objective's result on `batch`, or None."""
    if not (
        isinstance(terms, PolicyTerms)
        and isinstance(terms.loss, LossTerms)
        and isinstance(terms.stats, PolicyStats)
    ):
        return (
            f"must return PolicyTerms (loss terms and PolicyStats), got {type(terms).__name__}; "
            "build them with learner.algorithms.objectives.policy_terms"
        )
    rows, tokens = tuple(batch.lengths.shape), tuple(batch.mask.shape)
    stats, shapes = terms.stats, (rows, tokens)
    if not all(isinstance(t, torch.Tensor) for t in (terms.loss.terms, *stats[:3])):
        return "must return tensors as its terms and stats"
    if tuple(terms.loss.terms.shape) not in shapes or tuple(stats.ratio.shape) not in shapes:
        return f"must return terms and a stats ratio of shape [B] or [B, T] = {tokens}"
    if stats.clipped.shape != stats.ratio.shape or tuple(stats.log_ratio.shape) != tokens:
        return "stats lack the batch's shapes: clipped as the ratio, log_ratio [B, T]"
    return None


def _loss_problem(terms: PolicyTerms, batch: PolicyBatch) -> str | None:
    """What is wrong with the loss the reducer makes of well-shaped terms, or None."""
    loss = reduce_loss(terms.loss, batch.lengths, max_len=batch.mask.shape[1])
    if not loss.requires_grad:
        return "must return loss terms with a gradient"
    if not torch.isfinite(loss):
        return "returned a non-finite loss on a check batch"
    return None
