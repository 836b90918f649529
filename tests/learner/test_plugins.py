"""Your own objective as an arm (`learner.plugins`): the worked example's loss by hand, a plugin
arm validated like a built-in one, recorded (module, version, source digest) and part of the
config hash, broken plugins refused in one line naming them, and the example in a real trial."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from contract import metrics as M
from contract.record import read_trial_record
from harness.config import ConfigError, validate_config
from harness.provenance import provenance
from learner.algorithms.objectives import POLICY_LOSSES, POLICY_METRICS
from learner.config import ARM_MODELS, make_arm
from learner.plugins import PluginError, load_plugins
from tests.harness.trial_helpers import REPO, metrics, run_trial
from tests.learner.objective_inputs import run

EXAMPLE = REPO / "examples" / "clipped_reinforce.py"


def _config(plugin: Path | str, objective: str = "clipped_reinforce", **arm: object) -> dict:
    return {
        "plugins": [str(plugin)],
        "arms": [
            {"name": "crf", "objective": objective, **arm},
            {"name": "g", "objective": "grpo"},
        ],
    }


def test_example_plugin_arm_validates_like_a_built_in_one() -> None:
    cfg = validate_config(_config(EXAMPLE, eps_high=0.28))
    arm = cfg.arm("crf")
    assert type(arm) is ARM_MODELS["clipped_reinforce"]
    assert (arm.eps_low, arm.eps_high, arm.loss_units, arm.advantages) == (
        0.2,
        0.28,
        "tokens",
        "group",
    )
    assert cfg.model_dump(mode="json")["arms"][0]["eps_high"] == 0.28  # its own fields dumped
    with pytest.raises(ConfigError, match=r"arms\.0: .*does not read agg .*only grpo arms"):
        validate_config(_config(EXAMPLE, agg="token-mean"))


def test_example_loss_by_hand() -> None:
    """Rows: A = +1 over 2 tokens, A = -0.5 over 1 token (N = 3), right padding.
    At ratio 1 nothing is masked:
      loss = -(1/3) (1 (l00 + l01) - 0.5 l10) = -(1/3) (1 (-1 - 2) - 0.5 (-0.5)) = 0.916667
      d loss / d l = -keep A / N = (-1/3, -1/3 | +1/6)."""
    load_plugins([str(EXAMPLE)])
    objective = POLICY_LOSSES["clipped_reinforce"]
    arm = make_arm(name="c", objective="clipped_reinforce")
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, 9.0]], requires_grad=True)  # 9.0: padding
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -0.5])
    loss, stats = run(objective, logprobs, logprobs.detach(), adv, mask, arm, max_len=2)
    loss.backward()
    assert loss.item() == pytest.approx(0.916667, abs=1e-6)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1 / 3, -1 / 3], [1 / 6, 0.0]]))
    assert set(stats) == POLICY_METRICS and stats[M.POLICY_CLIP_FRAC] == 0.0
    # Token (0, 0) has moved past the range its advantage pushes: old -1.5, ratio e^0.5 = 1.65
    # > 1 + 0.2, A > 0: masked. loss = -(1/3) (1 (-2) - 0.5 (-0.5)) = 0.583333, its grad 0.
    logprobs.grad = None
    old = torch.tensor([[-1.5, -2.0], [-0.5, 0.0]])
    loss, stats = run(objective, logprobs, old, adv, mask, arm, max_len=2)
    loss.backward()
    assert loss.item() == pytest.approx(0.583333, abs=1e-6)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -1 / 3], [1 / 6, 0.0]]))
    assert stats[M.POLICY_CLIP_FRAC] == pytest.approx(1 / 3)
    assert stats[M.POLICY_CLIP_FRAC_HIGH] == stats[M.POLICY_CLIP_FRAC]


def test_plugin_is_recorded_and_part_of_the_config_hash(tmp_path: Path) -> None:
    copy = tmp_path / "my_reinforce.py"
    source = EXAMPLE.read_text().replace('"clipped_reinforce"', '"my_reinforce"')
    copy.write_text(source)
    first = validate_config(_config(copy, objective="my_reinforce"))
    facts = {p["entry"]: p for p in provenance()["plugins"]}
    assert facts[str(copy)]["version"] == "0.1.0"
    assert facts[str(copy)]["objectives"] == ("my_reinforce",)
    assert len(facts[str(copy)]["source_sha256"]) == 64
    # The same source at another path hashes alike in its record; another source does not.
    changed = tmp_path / "changed" / "my_reinforce.py"
    changed.parent.mkdir()
    changed.write_text(source.replace('"my_reinforce"', '"my_reinforce2"') + "\n# changed\n")
    second = validate_config(_config(changed, objective="my_reinforce2"))
    assert first.config_hash() != second.config_hash()


BROKEN = {
    "import_error": ("raise RuntimeError('boom at import')\n", "failed to import: RuntimeError"),
    "no_objective": ("X = 1\n", "registered no objective"),
    "signature": (
        "@register_objective(arm=Arm)\ndef loss(logprobs, old, adv, mask, options):\n    pass\n",
        "has parameters",
    ),
    "result": (
        "@register_objective(arm=Arm)\ndef loss(batch, settings):\n"
        "    return (batch.logprobs.sum() * 0.0, {'loss': 0.0})\n",
        "must return PolicyTerms",
    ),
    "stats": (
        "@register_objective(arm=Arm)\ndef loss(batch, settings):\n"
        "    t = policy_terms(batch, settings, batch.log_ratio, 'token-mean',\n"
        "                     ratio=batch.log_ratio.exp(), clipped=batch.lengths * 0.0)\n"
        "    return t\n",
        "stats lack",
    ),
    "no_gradient": (
        "@register_objective(arm=Arm)\ndef loss(batch, settings):\n"
        "    t = batch.log_ratio.detach()\n"
        "    return policy_terms(batch, settings, t, 'token-mean', ratio=t.exp(), clipped=t * 0)\n",
        "with a gradient",
    ),
    "clash": ("@register_objective(arm=Grpo)\ndef loss(batch, settings):\n    pass\n", ""),
}
HEADER = (
    "from typing import Literal\nfrom pydantic import Field\n"
    "from learner.algorithms.objectives import policy_terms\n"
    "from learner.config import GroupArm, GRPOArm as Grpo\n"
    "from learner.plugins import register_objective\n"
    "class Arm(GroupArm):\n    fixed_aggregation = 'token-mean'\n"
    "    objective: Literal['{name}'] = Field()\n"
    "    eps_low: float = 0.2\n    eps_high: float = 0.2\n"
)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_plugin_is_refused_in_one_line_naming_it(tmp_path: Path, case: str) -> None:
    body, expected = BROKEN[case]
    path = tmp_path / f"broken_{case}.py"
    path.write_text(HEADER.replace("{name}", f"broken_{case}") + body)
    with pytest.raises(ConfigError) as raised:
        validate_config(_config(path, objective=f"broken_{case}"))
    (problem,) = str(raised.value).splitlines()  # a single problem is one line
    assert problem.startswith("invalid configuration: <config>: Value error, ")
    assert expected in problem
    assert f"broken_{case}" in problem  # names the plugin or its objective
    assert f"broken_{case}" not in ARM_MODELS and f"broken_{case}" not in POLICY_LOSSES
    assert "grpo" in ARM_MODELS and POLICY_LOSSES["grpo"].__name__ == "grpo_loss"


def test_a_missing_plugin_file_or_module_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"plugin '.*nowhere\.py': no such file"):
        validate_config(_config(tmp_path / "nowhere.py"))
    with pytest.raises(ConfigError, match=r"plugin 'no_such_pkg\.losses' failed to import"):
        validate_config(_config("no_such_pkg.losses"))
    with pytest.raises(PluginError, match="failed to import"):
        load_plugins(["no_such_pkg.losses"])


@pytest.mark.slow
@pytest.mark.e2e
def test_example_plugin_arm_trains_in_a_real_trial(tmp_path: Path) -> None:
    """The worked example in a real trial (generator, Redis, learner): metrics, and the trial's
    provenance names the plugin."""
    out = tmp_path / "trial"
    plugin = tmp_path / "plugins" / "clipped_reinforce.py"
    plugin.parent.mkdir()
    shutil.copy(EXAMPLE, plugin)
    extra = (
        f"plugins=[{plugin}]",
        "arms=[{name: crf, objective: clipped_reinforce, eps_high: 0.28}]",
    )
    result = run_trial(out, "crf", steps=2, extra=extra)
    assert result.returncode == 0, result.stderr[-3000:]
    frame = metrics(out)
    assert list(frame.index) == [0, 1, 2]
    assert frame.loc[[1, 2], M.POLICY_LOSS].notna().all()
    record = read_trial_record(out)
    assert record is not None and record.objective == "clipped_reinforce"
    (plugin_fact,) = record.provenance["plugins"]
    assert plugin_fact["entry"] == str(plugin) and plugin_fact["version"] == "0.1.0"
