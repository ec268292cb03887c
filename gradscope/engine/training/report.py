"""What went wrong while a model trained: alerts from a ``GradientMonitor`` log (``gradscope train-report``).

- **nonfinite**: the first recorded step with a NaN/Inf, and where it came from, at layer level first: the first
  node (graph order) whose forward value is non-finite while its inputs are finite; else the loss; else the
  node nearest the output whose signal is non-finite while the signals of the nodes it feeds are finite (the
  backward pass of those nodes made it); else the first weight gradient. When that node's weights were already
  non-finite, the update of the step before made them so (``weights_nonfinite``). The op, when the monitor's
  eager replay found it, comes from the alert the monitor wrote.
- **vanishing / exploding / dead_relu** (and the other flow flags): a recorded step is flagged exactly as
  ``gradient_flow`` flags one batch (``flow.flow_rows``, same thresholds); a node is reported when it is flagged
  in at least half of the finite records (a layer that vanishes once in a noisy step is not a finding).
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from gradscope.core.results import NodeStats
from gradscope.core.training_log import NODE_COLUMNS, WEIGHT_COLUMNS, LogNode, StepRecord, TrainingLog
from gradscope.engine.diagnostics.flow import (
    FlowReport,
    FlowThresholds,
    WeightFlow,
    ancestors,
    flow_rows,
    unflag_fitted,
)
from gradscope.engine.training.spikes import loss_spikes, norm_lines, spike_detail

#: Flags reported from the flow of each step (``nan`` has its own alert; ``no_gradient`` is structural).
_TREND_FLAGS = ("vanishing", "exploding", "dead_relu", "zero_gradient", "no_gradient", "weights_zero_gradient")


@dataclass(frozen=True)
class TrainingAlert:
    kind: str  # nonfinite | vanishing | exploding | dead_relu | zero_gradient | no_gradient | weights_zero_gradient
    node: str | None
    first_step: int
    detail: str
    flagged: int = 1  # records flagged
    of: int = 1  # finite records looked at
    op: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def step_flow(log: TrainingLog, record: StepRecord | int, thresholds: FlowThresholds | None = None) -> FlowReport:
    """The gradient-flow report of one recorded step: what the flow view and ``gradscope flow`` show."""
    thresholds = thresholds or FlowThresholds()
    if not isinstance(record, StepRecord):
        record = log.record(int(record))
    col = {name: i for i, name in enumerate(NODE_COLUMNS)}
    stats: dict[str, NodeStats] = {}
    dead: dict[str, float] = {}
    for n, row in zip(log.nodes, record.nodes):
        if row[col["grad_none"]]:
            stats[n.id] = NodeStats.none()
        else:
            stats[n.id] = NodeStats.from_row(row[:6])
            if log.statistics == "magnitude" and row[col["size"]] > 0:  # mean|g| not recorded: the RMS
                rms = float(row[col["grad_norm"]]) / math.sqrt(float(row[col["size"]]))
                stats[n.id] = replace(stats[n.id], mean_abs=rms)
        dead[n.id] = float(row[col["dead_fraction"]])
    weights, by_node = [], {}
    columns = {name: record.weight_column(name) for name in WEIGHT_COLUMNS}
    for i, w in enumerate(log.weights):
        norm, gnorm, mean_abs, max_abs, nan, inf, none, touched = (
            float(columns[name][i])
            for name in (
                "norm",
                "grad_norm",
                "grad_mean_abs",
                "grad_max_abs",
                "grad_nan",
                "grad_inf",
                "grad_none",
                "norm_touched",
            )
        )
        if math.isnan(touched):  # a log of version 1
            touched = norm
        if log.statistics == "magnitude" and math.isnan(mean_abs) and not none:  # mean|g| not recorded: the RMS
            rows = float(columns["rows_touched"][i])
            size = (rows * math.prod(w.shape[1:])) if not math.isnan(rows) else math.prod(w.shape)
            mean_abs = gnorm / math.sqrt(size) if size > 0 else math.nan
        wf = WeightFlow(
            path=w.path,
            node=w.node,
            shape=w.shape,
            norm=norm,
            grad_norm=math.nan if none else gnorm,
            grad_mean_abs=math.nan if none else mean_abs,
            grad_max_abs=math.nan if none else max_abs,
            # a sparse gradient's update against the rows it touched (the whole |W| for a dense one)
            ratio=gnorm / touched if not none and touched > 0 else math.nan,
            nan_count=int(nan),
            inf_count=int(inf),
            is_none=bool(none),
        )
        weights.append(wf)
        if w.node is not None:
            by_node.setdefault(w.node, []).append(wf)
    outputs = log.output_nodes or [log.nodes[-1].id]
    upstream = ancestors({n.id: n.inputs for n in log.nodes}, outputs) - set(log.before_weights)
    rows, reference = flow_rows(log.nodes, stats, upstream, dead, by_node, thresholds)
    rows, note = unflag_fitted(rows, record.loss)
    meta: dict[str, Any] = {"step": record.step, "wall_time": record.wall_time, "plan": log.plan}
    if note:
        meta["note"] = note
    return FlowReport(
        model_name=log.model_name,
        target=f"training loss, step {record.step}",
        rows=rows,
        weights=weights,
        thresholds=thresholds,
        reference_node=reference,
        loss_value=record.loss,
        meta=meta,
    )


def _nonfinite_origin(log: TrainingLog, record: StepRecord) -> tuple[str | None, str]:
    """(node, what happened) for the first NaN/Inf of a record, looked for in the order one can arise."""
    col = {name: i for i, name in enumerate(NODE_COLUMNS)}
    index = {n.id: i for i, n in enumerate(log.nodes)}
    values = record.nodes[:, col["value_nonfinite"]]
    value_bad = values > 0  # NaN, not counted (a split layer's linear part), compares False
    grad_bad = (record.nodes[:, col["grad_nan"]] + record.nodes[:, col["grad_inf"]]) > 0
    if record.data_nonfinite:
        first = next((n.id for n, bad in zip(log.nodes, value_bad) if bad), None)
        return first, f"the batch itself has {int(record.data_nonfinite)} NaN/Inf value(s) (the model input)"
    bad_weights_of: dict[str, list[str]] = {}
    for w, bad in zip(log.weights, record.weight_column("value_nonfinite") > 0):
        if bad and w.node is not None:
            bad_weights_of.setdefault(w.node, []).append(w.path)

    def uncounted_inputs(n: LogNode) -> list[LogNode]:
        return [log.nodes[index[p]] for p in n.inputs if p in index and np.isnan(values[index[p]])]

    def any_input_bad(n: LogNode) -> bool:  # an uncounted input is looked through, to the inputs of its layer
        counted = [index[p] for p in n.inputs if p in index and not np.isnan(values[index[p]])]
        return any(value_bad[i] for i in counted) or any(any_input_bad(u) for u in uncounted_inputs(n))

    for i, n in enumerate(log.nodes):  # forward: the first node whose value goes bad from good inputs
        if value_bad[i] and not any_input_bad(n):
            parts = uncounted_inputs(n)  # the layer's linear part, not read in training: the layer is named
            what = (
                f"layer {n.layer_name or n.id} ({' + '.join([*(u.op_type for u in parts), n.activation or n.op_type])})"
                if parts
                else f"{n.id} ({n.op_type})"
            )
            bad_weights = [w for node in (n, *parts) for w in bad_weights_of.get(node.id, [])]
            if bad_weights and record.step == 0:  # no update has run yet: they came with the model
                return n.id, (
                    f"forward value of {what} is NaN/Inf because its weights {', '.join(bad_weights)} were NaN/Inf "
                    "before training began: the model was built, loaded or set with them (no update had run)"
                )
            if bad_weights:
                return n.id, (
                    f"forward value of {what} is NaN/Inf because its weights "
                    f"{', '.join(bad_weights)} already were: the optimizer update of the step before made "
                    "them so (look at that layer's |grad W| / |W| in the records before)"
                )
            return n.id, f"forward value of {what} is NaN/Inf while its inputs are finite"
    if math.isinf(record.loss):  # finite outputs whose loss overflows float32: they grew too large
        return None, (
            "the loss overflowed float32 (Inf) while every layer's output is finite: the outputs grew too large for "
            "the loss (the weights grow when the learning rate is too large: see the global norm of the steps before)"
        )
    if not math.isfinite(record.loss):
        return None, "the loss is NaN while every layer's output is finite (look at the loss and the labels)"
    consumers: dict[str, list[str]] = {}
    for n in log.nodes:
        for p in n.inputs:
            consumers.setdefault(p, []).append(n.id)
    for i in reversed(range(len(log.nodes))):  # backward: the signal nearest the output that goes bad
        n = log.nodes[i]
        above = [c for c in consumers.get(n.id, []) if c in index]
        if grad_bad[i] and not any(grad_bad[index[c]] for c in above):
            made_by = f"the backward pass of {', '.join(above)}" if above else "the loss's gradient"
            return n.id, f"the signal at {n.id} is NaN/Inf while the signals above it are finite: {made_by} made it"
    weight_grad_bad = (record.weight_column("grad_nan") + record.weight_column("grad_inf")) > 0
    if weight_grad_bad.any():
        w = log.weights[int(np.argmax(weight_grad_bad))]
        return w.node, f"the gradient of {w.path} is NaN/Inf while every layer's signal is finite"
    return None, "a NaN/Inf in the weights or their gradients"


def _first_nonfinite(log: TrainingLog, record: StepRecord) -> TrainingAlert:
    step = record.step
    node, detail = _nonfinite_origin(log, record)
    op = None
    for alert in log.alerts:
        if int(alert.get("step", -1)) == step and alert.get("op"):
            op = alert["op"]
            where = alert.get("variable") or alert.get("node") or ""
            detail += f"; replayed with check_numerics: op {op}" + (f" at {where}" if where else "")
            detail += f" ({alert.get('phase')})" if alert.get("phase") else ""
    detail += _replica_text(log, step)
    weight_grads_bad = (record.weight_column("grad_nan") + record.weight_column("grad_inf")).any()
    if not math.isfinite(record.loss) or weight_grads_bad:  # what the monitor checks every step
        detail += f" (step {step} is the first whose loss or weight gradients were not finite: checked every step)"
    else:
        detail += f" (first seen in the records, every {log.every} steps: the NaN/Inf did not reach the loss)"
    return TrainingAlert("nonfinite", node, step, detail, op=op)


def _unrecorded_nonfinite(log: TrainingLog, first_recorded: int | None) -> TrainingAlert | None:
    """The first non-finite step from the monitor's replay alert when no non-finite record holds it: its replay
    (with the weights it saw) did not make the NaN/Inf again, so no record stands in for it. The monitor's
    sentinel saw it all the same."""
    steps = [a for a in log.alerts if "step" in a and (first_recorded is None or int(a["step"]) < first_recorded)]
    if not steps:
        return None
    alert = min(steps, key=lambda a: int(a["step"]))
    step = int(alert["step"])
    replay = alert.get("message") or "its replay did not make the NaN/Inf again"
    if any(r.step == step for r in log.records):  # recorded, and its record is finite: say so, invent nothing
        detail = (
            f"the monitor found the loss or weight gradients of step {step} not finite (checked every step), but "
            f"the step's record is finite and {replay}"
        )
    else:
        detail = (
            f"the loss or weight gradients of step {step} were not finite (checked every step); the step fell "
            f"between records and was not recorded: {replay}"
        )
    detail += _replica_text(log, step)
    return TrainingAlert("nonfinite", alert.get("node"), step, detail, op=alert.get("op"))


def _replica_text(log: TrainingLog, step: int) -> str:
    """Where the NaN started under tf.distribute: the replica whose own gradient went bad (the monitor's replay)."""
    for alert in log.alerts:
        if int(alert.get("step", -1)) == step and alert.get("replica") is not None and log.replicas > 1:
            return f"; it started on replica {alert['replica']} of {log.replicas} (its shard of the batch was replayed)"
    return ""


def training_alerts(
    log: TrainingLog, thresholds: FlowThresholds | None = None, spike: float = 5.0
) -> list[TrainingAlert]:
    """NaN/Inf first, then the loss spikes (global gradient norm above ``spike`` x the running median), then the
    nodes the flow flags in at least half of the finite records."""
    thresholds = thresholds or FlowThresholds()
    alerts: list[TrainingAlert] = []
    # a record of an update the loss scaler skipped (its gradients overflowed, the loss finite) is neither a NaN
    # nor a finite record; Keras repeats the step number, and the record of the update that ran replaces it
    skipped = {step for step, _ in log.overflows}
    records = [r for r in log.records if not (r.step in skipped and not r.finite and math.isfinite(r.loss))]
    bad = [r for r in records if not r.finite]
    unrecorded = _unrecorded_nonfinite(log, bad[0].step if bad else None)
    if unrecorded is not None:
        alerts.append(unrecorded)
    elif bad:
        alerts.append(_first_nonfinite(log, bad[0]))
    finite = [r for r in records if r.finite]
    counts: dict[tuple[str, str], list[int]] = {}
    for r in finite:
        for row in step_flow(log, r, thresholds).rows:
            for flag in row.flags:
                if flag in _TREND_FLAGS:
                    counts.setdefault((flag, row.node), []).append(r.step)
    for (flag, node), steps in counts.items():
        if len(steps) * 2 >= len(finite):
            alerts.append(
                TrainingAlert(
                    flag,
                    node,
                    steps[0],
                    f"{flag.replace('_', ' ')} in {len(steps)} of {len(finite)} finite records, from step {steps[0]}",
                    flagged=len(steps),
                    of=len(finite),
                )
            )
    node_of_layer: dict[str, str] = {}
    for n in log.nodes:
        node_of_layer.setdefault(n.layer_name or n.id, n.id)
    for s in loss_spikes(log, spike):
        top = node_of_layer.get(s.layers[0][0]) if s.layers else None
        alerts.append(TrainingAlert("spike", top, s.step, spike_detail(s)))
    order = {name: i for i, name in enumerate(("nonfinite", "spike", *_TREND_FLAGS))}
    position = {n.id: i for i, n in enumerate(log.nodes)}
    alerts.sort(key=lambda a: (order.get(a.kind, 99), position.get(a.node or "", -1)))
    return alerts


def _run_lines(log: TrainingLog) -> list[str]:
    """Which run is shown when the folder holds several (two processes logging into one folder)."""
    if len(log.runs) < 2:
        return []
    when = time.strftime
    listed = "; ".join(
        f"{r.id} ({r.model_name}, started {when('%Y-%m-%d %H:%M:%S', time.localtime(r.started))}, {r.records} records)"
        for r in log.runs
    )
    latest = log.run_id == log.runs[-1].id
    return [
        f"This folder holds {len(log.runs)} runs: {listed}.",
        f"Showing run {log.run_id}{', the latest' if latest else ''} (--run ID shows another).",
    ]


def stopped_before_first_record(log: TrainingLog) -> str | None:
    """Why a run without records will get none (None: it may still be starting): the failure its monitor wrote,
    or its process is gone (same host)."""
    if log.records:
        return None
    if log.failure:
        return log.failure
    if _writer_gone(log):
        pid, host = log.writer.get("pid"), log.writer.get("host")
        return f"its process ({pid} on {host}) ended before the first step finished, and wrote no reason"
    return None


def _writer_gone(log: TrainingLog) -> bool:
    """Whether the process that wrote the log has ended (known on its own host only)."""
    pid, host = log.writer.get("pid"), log.writer.get("host")
    if pid is None or host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OSError, ValueError):
        return False
    return False


def _cut_short_line(log: TrainingLog) -> list[str]:
    """A log whose last record was cut mid-write (a full disk, a killed process) must not read as training that
    ended at its last whole record."""
    if not log.cut_bytes or not _writer_gone(log):
        return []
    last = f"after step {log.records[-1].step} " if log.records else ""
    return [
        f"warning: the log is cut short: it ends inside a record ({log.cut_bytes} bytes; a full disk or a process "
        f"killed while writing), so what training did {last}is not in it."
    ]


def _loss_summary(records: list[StepRecord]) -> str:
    """ "; loss first -> last": the last finite loss is not the last loss when the run went NaN, so say where the
    finite losses end and how many records after them are not finite."""
    finite = [r for r in records if math.isfinite(r.loss)]
    if not finite:
        return "; the loss is NaN/Inf in every record"
    text = f"; loss {finite[0].loss:.4g} -> {finite[-1].loss:.4g}"
    after = [r for r in records if r.step > finite[-1].step]
    if after:
        text += f" (step {finite[-1].step}), then NaN/Inf in the {len(after)} later record(s)"
    return text


def report_text(log: TrainingLog, alerts: list[TrainingAlert]) -> str:
    records = log.records
    head = f"Training log {log.folder}: model {log.model_name!r}, {len(log.nodes)} nodes"
    if log.statistics == "magnitude":
        head += " (magnitude statistics: RMS in place of mean |g|, no zero fraction)"
    if log.plan:
        entries = log.plan.get("entries", [])
        head += f", trained with a plan of {len(entries)} rule(s): " + "; ".join(
            f"{e.get('select')} -> {e.get('rule')}" for e in entries
        )
    lines = [head, *_run_lines(log), *(f"warning: {p}" for p in log.problems), *_cut_short_line(log)]
    stopped = stopped_before_first_record(log)
    if stopped:
        why = stopped if log.failure else f"the run stopped before its first record: {stopped}"
        return "\n".join([*lines, f"Nothing recorded: {why}."])
    if not records:
        return "\n".join([*lines, "No step recorded yet (the run is starting)."])
    lines.append(
        f"{len(records)} records (every {log.every} steps), steps {records[0].step}..{records[-1].step}"
        + _loss_summary(records)
    )
    if log.replicas > 1:
        lines.append(f"{log.replicas} replicas in sync: the statistics are of the global batch (after the all-reduce)")
    if not alerts:
        lines.append("No alerts: every record is finite and no layer vanishes, explodes or dies.")
    lines += norm_lines(log)
    groups: dict[tuple, list[TrainingAlert]] = {}
    for a in alerts:  # one line for the nodes a flag holds for alike (a vanishing stack is one finding)
        key = (
            (a.kind, a.first_step, a.detail)
            if a.kind in ("nonfinite", "spike")
            else (a.kind, a.first_step, a.flagged, a.of)
        )
        groups.setdefault(key, []).append(a)
    for group in groups.values():
        a = group[0]
        nodes = [g.node for g in group if g.node]
        where = ""
        if nodes:
            where = f" at {', '.join(nodes[:6])}" + (f" and {len(nodes) - 6} more" if len(nodes) > 6 else "")
        if a.kind == "spike":
            lines.append(f"[spike] step {a.first_step}: {a.detail}")
            continue
        detail = a.detail if a.kind == "nonfinite" else f"{a.flagged} of {a.of} finite records"
        lines.append(f"[{a.kind}] from step {a.first_step}{where}: {detail}")
    return "\n".join(lines)
