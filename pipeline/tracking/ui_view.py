"""The MLflow experiment page's shared view: the runs table with Parallax's columns on first load, in any browser.

MLflow 3's runs table shows only Source, Models and Dataset until a user ticks metric columns, and keeps that pick
in the browser's localStorage, so every new browser (a colleague's, a laptop's) starts blank. MLflow's own "share
view" feature is the server-side way: the page state is an experiment tag `mlflow.sharedViewState.<key>`, and a
link with `?viewStateShareKey=<key>` loads it (mlflow/server/js: useSharedExperimentViewState). Parallax writes that
tag with a fixed key (`parallax`) and links to it with `workflowType=machine_learning`, the URL parameter MLflow's
sidebar reads before its own localStorage choice, so the page opens on model training, not GenAI. Nothing of MLflow
is re-implemented: the tag and the link are MLflow's; this module only decides the columns and their widths.

The tag carries every field of MLflow 3's default page state (createExperimentPageUIState in MLflow 3.17's bundle)
with the columns changed: 3.17's reader fills missing fields with defaults itself, earlier 3.x readers replace the
whole state with the shared one.

What a link can choose, and what this view chooses so that the first screen at 1400 px answers: the columns
(selectedColumns: the study rows' numbers only, the best throughput and the weak-scaling efficiency first; no
parameter column, since a study row has none of a trial's parameters and a trial's name carries its k, B and lr),
the columns' widths (columnWidths: a compact Run Name, whose study names start with the strategy, Created as wide as
"12 minutes ago", numbers as narrow as their headers allow), the sort and the table or chart view (compareRunsMode
in the URL). The view keeps MLflow's newest-first sort, the one order under which MLflow nests a study's trials
under its row (its nestChildren rule: by a metric the trials would stand beside the studies), and the table, where
the numbers are read off: a run per study fits the first screen. MLflow's Assistant panel is none of these: it opens
beside every page on a local server's first visit and remembers being closed in the browser's localStorage
(`mlflow.assistant.panelOpen`), which no tag or URL parameter sets.
"""

from __future__ import annotations

import json
import sys
from urllib.parse import urlencode

from pipeline.tracking.client import PIPELINE_RUN_TAG  # which pipeline run (DVC experiment) a run is of
from pipeline.tracking.metric_names import PEAK_MIB

SHARE_TAG_PREFIX = "mlflow.sharedViewState."  # MLflow's EXPERIMENT_PAGE_VIEW_STATE_SHARE_TAG_PREFIX
VIEW_KEY = "parallax"
# the runs table's columns, in the order a reader needs them, where the store has them: each strategy's best img/s
# and weak-scaling efficiency (the answer), the peak MiB at that best point, the best accuracy, the largest k measured,
# how many trials were flagged, the worst memory imbalance. Every one is a number the study (parent) row carries
# (metric_names.study_row_metrics, study_view.study_metrics), so the collapsed rows show no `-` but where a figure is
# undefined; a trial row, under its study's +, shows its own peak MiB and flag, its name its k, B and lr.
COLUMNS = (
    "metrics.`best_throughput_img_s`",
    "metrics.`weak_efficiency`",
    f"metrics.`{PEAK_MIB}`",
    "metrics.`best_test_acc`",
    "metrics.`largest_k`",
    "metrics.`flagged`",
    "metrics.`worst_mem_imbalance`",
)
# the ids of MLflow's runs-table columns Run Name and Created (its grid names Created after its field)
RUN_NAME, CREATED = "attributes.`Run Name`", "runDateAndNestInfo"
# pixels: MLflow's defaults are 190 for Run Name, 150 for Created and wider for a number than its value needs:
# "study ddp_amp · …" keeps the strategy, "12 minutes ago" stays whole, and each header reads to its last word
WIDTHS = {
    RUN_NAME: 170,
    CREATED: 125,
    "metrics.`best_throughput_img_s`": 165,
    "metrics.`weak_efficiency`": 125,
    f"metrics.`{PEAK_MIB}`": 120,
    "metrics.`best_test_acc`": 125,
    "metrics.`largest_k`": 100,
    "metrics.`flagged`": 90,
    "metrics.`worst_mem_imbalance`": 185,
}
# MLflow 3's search facets for "all active runs, newest first" (useExperimentPageSearchFacets' defaults)
FACETS = {
    "searchFilter": "",
    "orderByKey": "attributes.start_time",
    "orderByAsc": False,
    "startTime": "ALL",
    "lifecycleFilter": "Active",
    "modelVersionFilter": "All Runs",
    "datasetsFilter": [],
}
# MLflow 3's default UI state, field for field; the view changes selectedColumns, columnOrder, columnWidths and
# runsExpanded
UI_DEFAULTS = {
    "columnOrder": [],
    "columnWidths": {},
    "runsPinned": [],
    "runsHidden": [],
    "runsVisibilityMap": {},
    "runsHiddenMode": "FIRST_10_RUNS",
    "viewMaximized": False,
    "runListHidden": False,
    "isAccordionReordered": False,
    "useGroupedValuesInCharts": True,
    "hideEmptyCharts": True,
    "groupBy": None,
    "groupsExpanded": {},
    "autoRefreshEnabled": True,
    "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
}


def latest_pipeline_run(runs) -> str | None:
    """The pipeline run (tag PIPELINE_RUN_TAG) of the newest study run (a sweep's parent, tag role=study), else of
    the newest run that has one: a standalone `python -m pipeline train` (the report's own command, say) started
    after the sweep never hides it."""
    tagged = [r for r in runs if r.data.tags.get(PIPELINE_RUN_TAG)]
    tagged = [r for r in tagged if r.data.tags.get("role") == "study"] or tagged
    return max(tagged, key=lambda r: r.info.start_time or 0).data.tags[PIPELINE_RUN_TAG] if tagged else None


def view_state(runs) -> dict:
    """The page state for `runs` (MLflow Run objects of one experiment): the latest pipeline run's runs only, with
    the COLUMNS the store has, at their WIDTHS, newest first. Its runs are grouped by study, the study (parent) rows
    collapsed, each showing its study's summary metrics: MLflow does not share expanded rows (its reader drops
    runsExpanded, runsPinned, runsHidden), so a user expands a study with its +."""
    latest = latest_pipeline_run(runs)
    if latest:
        runs = [r for r in runs if r.data.tags.get(PIPELINE_RUN_TAG) == latest]
    have = {f"metrics.`{k}`" for r in runs for k in r.data.metrics} | {
        f"params.`{k}`" for r in runs for k in r.data.params
    }
    cols = [c for c in COLUMNS if c in have]
    search = "tags.`{}` = '{}'".format(PIPELINE_RUN_TAG, latest.replace("'", "\\'")) if latest else ""
    # MLflow applies a width to the columns columnOrder names: Run Name and Created (pinned, they stay first) and
    # the numbers
    order = [RUN_NAME, CREATED, *cols]
    return {
        **FACETS,
        **UI_DEFAULTS,
        "searchFilter": search,
        "selectedColumns": cols,
        "columnOrder": order,
        "columnWidths": {c: WIDTHS[c] for c in order if c in WIDTHS},
        "runsExpanded": {},
    }


def publish(client, experiment_id: str, max_runs: int = 5000) -> dict:
    """Write the shared view of `experiment_id` (an MlflowClient's store) and return its state."""
    state = view_state(client.search_runs([experiment_id], max_results=max_runs))
    client.set_experiment_tag(experiment_id, SHARE_TAG_PREFIX + VIEW_KEY, json.dumps(state, separators=(",", ":")))
    return state


def path(experiment_id: str) -> str:
    """The UI route that opens the shared view (after http://host:port/)."""
    query = urlencode({"workflowType": "machine_learning", "viewStateShareKey": VIEW_KEY})
    return f"#/experiments/{experiment_id}/runs?{query}"


def publish_view(client, experiment_id: str) -> str | None:
    """publish(), for callers whose work is done either way (the analysis stage, `pipeline ui`): the view's UI route,
    or None with a warning on stderr if the store refused the tag."""
    try:
        publish(client, experiment_id)
    except Exception as e:  # a read-only store, a permission: the view is a convenience, the runs are logged
        print(
            f"warning: the MLflow runs-table view was not written ({type(e).__name__}: {e}); pick the columns "
            f"under Columns in the UI instead",
            file=sys.stderr,
        )
        return None
    return path(experiment_id)


def publish_for(tracker) -> str | None:
    """publish_view() of a Tracker's experiment: the view's UI route, or None (with a warning) if the store refused
    it. Takes the Tracker, never its client, so that no caller outside pipeline/tracking/ reaches into MLflow."""
    return publish_view(tracker.client, tracker.experiment_id)
