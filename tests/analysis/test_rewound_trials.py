"""The Trials table shows a trial a bounded-mode resume rewound (issue 41): how many trials of
each cell were rewound and the groups the rewinds cost, with one line per rewound trial; an
experiment with no rewind shows neither (sections show only what varies)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analysis import ReportConfig
from analysis.loading import load_experiment
from analysis.report import analyse
from analysis.sections.base import Page
from analysis.sections.trials import blocks as trial_blocks
from analysis.synthetic import SyntheticSpec, write_experiment
from contract import metrics as mn
from contract.layout import TrialPaths

CONFIG = ReportConfig(n_resamples=100, curve_resamples=100, make_figures=False)
SPEC = SyntheticSpec(skill={"gspo": 0.7, "grpo": 0.6}, seeds=(0, 1), lags=(1,), steps=10)
REWIND_AT = {  # step -> (lost_groups, withdrawn_versions, withdrawn_groups)
    5: (4.0, 2.0, float("nan")),
    6: (float("nan"), float("nan"), 3.0),
    8: (0.0, 1.0, 2.0),
}


def _rewind(trial_dir: Path) -> None:
    """Give the trial two rewinds: 4 groups lost and 3 dropped after the first, 2 dropped
    after the second (which lost none), as the learner logs them."""
    names = (mn.REWIND_LOST_GROUPS, mn.REWIND_WITHDRAWN_VERSIONS, mn.REWIND_WITHDRAWN_GROUPS)
    for part in sorted(TrialPaths(trial_dir).metrics.glob("part-*.parquet")):
        table = pq.read_table(part)
        steps = table[mn.STEP].to_pylist()
        for index, name in enumerate(names):
            values = [REWIND_AT.get(s, (float("nan"),) * 3)[index] for s in steps]
            table = table.append_column(name, pa.array(values, pa.float64()))
        pq.write_table(table, part)


def _page(tmp_path: Path, *, rewound: bool) -> tuple[Page, object]:
    root = write_experiment(tmp_path, SPEC)
    experiment = load_experiment(root)
    names = sorted(experiment.trials["trial_name"])
    trial = next(n for n in names if n == "grpo-s1-lag1")
    if rewound:
        _rewind(root / "trials" / trial)
        experiment = load_experiment(root)
    analysis = analyse(experiment, CONFIG)
    page = Page(
        analysis.summary, {}, CONFIG, analysis.inputs.scores, analysis.inputs.experiment.problems
    )
    return page, trial


def _cell_values(page: Page, statistic: str) -> dict[str, float]:
    s = page.summary
    rows = s[(s["section"] == "trials") & (s["statistic"] == statistic)]
    return dict(zip(rows["arm"], rows["value"], strict=True))


def test_a_rewound_trial_is_counted_and_named(tmp_path: Path) -> None:
    page, trial = _page(tmp_path, rewound=True)
    assert _cell_values(page, "rewound") == {"grpo": 1, "gspo": 0}
    assert _cell_values(page, "groups lost to rewinds") == {"grpo": 4 + 3 + 2, "gspo": 0}
    shown = trial_blocks(page)
    assert any(b.kind == "p" and b.text.startswith("rewound: trials a bounded-mode") for b in shown)
    [items] = [b.items for b in shown if b.kind == "list" and any("rewound" in i for i in b.items)]
    assert items == [f"{trial}: rewound 2 time(s), 9 group(s) lost"]


def test_no_rewind_no_rewind_rows(tmp_path: Path) -> None:
    page, _trial = _page(tmp_path, rewound=False)
    assert _cell_values(page, "rewound") == {} == _cell_values(page, "groups lost to rewinds")
    assert not any(b.kind == "p" and b.text.startswith("rewound:") for b in trial_blocks(page))
