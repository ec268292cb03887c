"""What a training log holds: the layout of the records ``GradientMonitor`` writes and the reader returns.

Plain data, shared by the writer (``gradscope.engine.training.monitor``, in-graph) and the reader
(``gradscope.io.training_events``): one row per node and one per trainable variable, per recorded step, in the
column order below. TensorBoard shows the scalars and histograms written beside them; gradscope reads these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from gradscope.core.display import RichDisplay
from gradscope.core.errors import InputError

#: The TensorBoard plugin name the matrices and the meta data are written under (TensorBoard keeps, not shows, them).
PLUGIN = "gradscope"
META_TAG = "gradscope/meta"
NODES_TAG = "gradscope/nodes"
WEIGHTS_TAG = "gradscope/weights"
LOSS_TAG = "gradscope/loss"  # [loss, NaN/Inf count in the batch]
ALERT_TAG = "gradscope/alert"
CHECKPOINT_TAG = "gradscope/checkpoint"
#: Every step: [loss, global gradient norm, the norm of each trainable variable's gradient] (unscaled).
NORMS_TAG = "gradscope/norms"
#: A step a loss scaler skipped for an overflow: [the loss scale it had].
OVERFLOW_TAG = "gradscope/overflow"
LOG_VERSION = 2

_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_./-]")


def tensorboard_tag(kind: str, name: str) -> str:
    """The TensorBoard tag of a node's or variable's series: ``grad/conv1_pre`` for node ``conv1:pre``."""
    return f"{kind}/{_TAG_UNSAFE.sub('_', name)}"


#: Per node: the statistics the flow view shows of the signal at its output (``grad_*``, as ``stats_rows``),
#: whether no gradient reached it, how many forward values were NaN/Inf (counted on the first step whose loss or
#: weight gradients were not finite, 0 on other records; NaN, not counted, for the linear part of a layer with a
#: fused activation, ``conv1:pre``: its activation's value carries a NaN on), and (ReLU-like nodes) the fraction of
#: units that were 0 for the whole batch (NaN elsewhere), and the signal's size (elements, whole batch).
#: With ``statistics="magnitude"`` the monitor leaves mean|g| and the zero fraction NaN.
#: The statistics of a gradient, in ``stats_rows``' order, and whether there was none.
_GRADIENT = ("grad_norm", "grad_mean_abs", "grad_max_abs", "grad_zero_fraction", "grad_nan", "grad_inf", "grad_none")
NODE_COLUMNS = (*_GRADIENT, "value_nonfinite", "dead_fraction", "size")
#: Per trainable variable: |W| and the statistics of its gradient; ``value_nonfinite``: NaN/Inf in W itself. A
#: sparse gradient (an Embedding's) is measured over the rows the step touched: ``rows_touched`` counts them
#: (NaN: a dense gradient) and ``norm_touched`` is |W| over them (|W| for a dense one), the update ratio's
#: denominator. Logs of version 1 lack the last two (read as NaN).
WEIGHT_COLUMNS = ("norm", *_GRADIENT, "value_nonfinite", "norm_touched", "rows_touched")


@dataclass(frozen=True)
class LogNode:
    id: str
    layer_name: str | None
    op_type: str
    inputs: tuple[str, ...]
    activation: str | None = None


@dataclass(frozen=True)
class LogWeight:
    path: str
    node: str | None
    shape: tuple[int, ...]


@dataclass
class StepRecord:
    """The statistics of one recorded training step (``nodes``: (n_nodes, len(NODE_COLUMNS)))."""

    step: int
    wall_time: float
    nodes: np.ndarray
    weights: np.ndarray
    loss: float = float("nan")
    data_nonfinite: float = 0.0  # NaN/Inf in the batch itself (counted on the first non-finite step)

    def node_column(self, name: str, uncounted: float | None = None) -> np.ndarray:
        """One column; ``uncounted``: what NaN (not counted) reads as (None: left NaN)."""
        column = self.nodes[:, NODE_COLUMNS.index(name)]
        return column if uncounted is None else np.nan_to_num(column, nan=uncounted)

    def weight_column(self, name: str) -> np.ndarray:
        index = WEIGHT_COLUMNS.index(name)
        if index >= self.weights.shape[1]:  # an older log's record
            return np.full(self.weights.shape[0], np.nan)
        return self.weights[:, index]

    @property
    def finite(self) -> bool:
        bad = self.node_column("grad_nan") + self.node_column("grad_inf") + self.node_column("value_nonfinite", 0.0)
        wbad = self.weight_column("grad_nan") + self.weight_column("grad_inf") + self.weight_column("value_nonfinite")
        return not (bad.any() or wbad.any() or self.data_nonfinite) and bool(np.isfinite(self.loss))


@dataclass(frozen=True)
class RunInfo:
    """One run in a log folder (a monitor's meta and what followed it): two processes logging into one folder
    are two runs."""

    id: str
    started: float  # wall time of its meta event
    model_name: str
    records: int


@dataclass
class StepNorms:
    """What the monitor keeps of every step (not only the records): the loss, the global gradient norm and each
    variable's, as the optimizer got them (after the all-reduce, before clipping, loss scale undone). The loss
    spikes of ``train-report`` are read from these."""

    steps: np.ndarray  # (n,) int
    loss: np.ndarray  # (n,)
    global_norm: np.ndarray  # (n,)
    variables: np.ndarray  # (n, n_variables)

    def __len__(self) -> int:
        return len(self.steps)


@dataclass
class TrainingLog(RichDisplay):
    """A log folder read back: the model's nodes and weights, the records in step order, the alerts the monitor
    wrote (the op a NaN came from), and the checkpoints saved beside it."""

    _html_maker = "gradscope.app.display.reports:training_html"  # in a notebook (gradscope.core.display)

    folder: str
    model_name: str
    nodes: list[LogNode]
    weights: list[LogWeight]
    output_nodes: list[str]
    every: int
    records: list[StepRecord] = field(default_factory=list)
    alerts: list[dict] = field(default_factory=list)
    plan: dict | None = None  # the plan trained with (plan_model), as Plan.to_dict
    statistics: str = "all"  # "magnitude": mean|g| and zero fraction were not recorded (see GradientMonitor)
    before_weights: list[str] = field(default_factory=list)  # nodes no gradient reaches in training, by design
    #: (file name in ``folder``, the last step whose update it holds), as the monitor saw them appear
    checkpoints: list[tuple[str, int]] = field(default_factory=list)
    run_id: str | None = None  # the run shown (the latest in the folder unless another was asked for)
    runs: list[RunInfo] = field(default_factory=list)  # every run in the folder, oldest first
    failure: str | None = None  # why the run recorded nothing, as the monitor wrote it (no trainable weights...)
    problems: list[str] = field(default_factory=list)  # damaged records, named and skipped
    cut_bytes: int = 0  # bytes at the end of the event files that hold no whole record (being written, or cut)
    norms: StepNorms | None = None  # every step's norms (logs of version 2)
    #: (optimizer step, loss scale) of each update a loss scaler skipped for an overflow (Keras does not count a
    #: skipped update, so the steps repeat)
    overflows: list[tuple[int, float]] = field(default_factory=list)
    clipping: dict = field(default_factory=dict)  # the optimizer's clipnorm / global_clipnorm (when set)
    replicas: int = 1  # replicas in sync (tf.distribute)
    writer: dict = field(default_factory=dict)  # the run's host, pid, start (its meta's "run")

    def summary(self) -> str:
        return f"<TrainingLog: {self.model_name}, {len(self.records)} records, every {self.every} steps>"

    @property
    def steps(self) -> list[int]:
        return [r.step for r in self.records]

    def record(self, step: int) -> StepRecord:
        for r in self.records:
            if r.step == step:
                return r
        if not self.records:
            raise InputError(f"{self.folder} holds no recorded step yet.")
        steps = self.steps
        near = min(steps, key=lambda s: abs(s - step))
        shown = ", ".join(map(str, steps[:5])) + (f", ... {steps[-1]}" if len(steps) > 5 else "")
        raise InputError(
            f"Step {step} was not recorded in {self.folder}; recorded steps: {shown} (every {self.every}; nearest: "
            f"{near})."
        )

    def node_index(self, node_id: str) -> int:
        for i, n in enumerate(self.nodes):
            if n.id == node_id:
                return i
        raise KeyError(f"No node {node_id!r} in the training log.")

    def matrix(self, column: str = "grad_mean_abs", uncounted: float | None = None) -> np.ndarray:
        """(n_nodes, n_records) of one node column: the heatmap's values. A log of magnitude statistics gives
        the RMS (norm / sqrt(size)) for mean|g|, as its report does. ``uncounted`` as in ``node_column``."""
        if not self.records:
            return np.zeros((len(self.nodes), 0))
        if column == "grad_mean_abs" and self.statistics == "magnitude":
            with np.errstate(divide="ignore", invalid="ignore"):
                return self.matrix("grad_norm") / np.sqrt(self.matrix("size"))
        return np.stack([r.node_column(column, uncounted) for r in self.records], axis=1)
