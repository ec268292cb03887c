"""Reports as HTML: a sanity report, an evaluation, a gradient-flow report and a training log (the step x layer
heat map of mean |g|, the loss with its spikes and first NaN, the alerts, the last record's flow over the
first's). The numbers and words are the ones ``to_text()`` / ``train-report`` print."""

from __future__ import annotations

import json
import math
from typing import Any

from gradscope.app.display.html import alerts, esc, figure, fragment, table


def _num(v: Any, fmt: str = ".4g") -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


# ----------------------------------------------------------------------------------------------- sanity
def sanity_html(report: Any) -> str:
    parts = [f"<h3>Sanity checks for {esc(report.method)} (target value {report.target_value:.4g})</h3>"]
    if report.conservation:
        flagged = [r.node for r in report.conservation if r.flagged]
        parts.append(
            f"<h3>Conservation</h3><div class='note'>relevance = {esc(report.relevance)}; tolerance "
            f"{report.tolerance:.0%}</div>"
        )
        parts.append(alerts([f"not conserved at {n}" for n in flagged], ok="holds at every one-to-one node"))
        rows = [
            (
                r.node,
                _num(r.relevance, ".5g"),
                _num(r.ratio_to_target),
                _num(r.ratio_to_producer),
                "✗" if r.flagged else "",
            )
            for r in report.conservation
        ]
        parts.append(table(["node", "R", "R / target", "producer / this", "broken"], rows))
    if report.randomisation:
        last = report.randomisation[-1].rank_correlation
        parts.append("<h3>Model randomisation (Adebayo et al. 2018)</h3>")
        parts.append(
            alerts(["the map no longer depends on the weights: it does not explain the model"])
            if last > 0.5
            else alerts([], ok="the map changes with the weights, as an explanation of the model should")
        )
        rows = [(f"down to {r.layer}", f"{r.rank_correlation:+.3f}") for r in report.randomisation]
        parts.append(table(["weights re-initialised", "rank correlation with the original map"], rows))
    if report.finite_differences:
        flagged = [r.node for r in report.finite_differences if r.flagged]
        parts.append(f"<h3>Finite differences (tolerance {report.tolerance:.0%})</h3>")
        parts.append(alerts([f"differs at {n}" for n in flagged], ok="all agree"))
        rows = [(r.node, f"{r.relative_error:.2e}", "✗" if r.flagged else "") for r in report.finite_differences]
        parts.append(table(["node", "relative error", "differs"], rows))
    elif report.checked_finite_differences:
        parts.append("<div class='note'>Finite differences: every node lies below a rule; nothing to check.</div>")
    return fragment("".join(parts))


# ----------------------------------------------------------------------------------------------- evaluation
def evaluation_body(report: Any) -> str:
    from gradscope.app.evaluation.report import CONFIDENCE, HIGHER_IS_BETTER
    from gradscope.render.curves import curves_png

    head = f"{report.images} of {report.total} {report.unit} scored"
    if not report.complete:
        head += " (stopped: run again with the same out folder to resume)"
    parts = [f"<h3>Evaluation</h3><div class='note'>{esc(head)}</div>"]
    if report.bad:
        parts.append(
            alerts(
                [
                    f"{len(report.bad)} sample(s) could not be used, e.g. {report.bad[0]['key']}: "
                    f"{report.bad[0]['reason']}"
                ]
            )
        )

    def scored(method: str, metric: str) -> str:
        row = next((r for r in report.table if r["method"] == method and r["metric"] == metric), None)
        value = _num(row["value"], ".3f") if row is not None else ""
        return f"{value} [{_num(row['ci_low'], '.3f')}, {_num(row['ci_high'], '.3f')}]" if value else ""

    # a metric no method has a value for (pointing_difficult without difficult images) is a note, not a column
    # of dashes that pushed deletion out of a 1280 px page's column
    shown = [m for m in report.metrics if any(scored(method, m) for method in report.methods)]
    rows = []
    for method in report.methods:
        cells = [method, *(scored(method, metric) or "–" for metric in shown)]
        cells.append(f"{report.seconds.get(method, 0.0):.1f} s" if report.seconds else "")
        rows.append(cells)
    header = ["method", *(f"{m} {'↑' if HIGHER_IS_BETTER.get(m, True) else '↓'}" for m in shown), "time"]
    parts.append(table(header, rows))
    empty = [m for m in report.metrics if m not in shown]
    parts.append(
        f"<div class='note'>value [{CONFIDENCE:.0%} bootstrap interval over {report.unit}]; ↑ higher is better, "
        "↓ lower is better" + (f"; no value for {', '.join(empty)}" if empty else "") + "</div>"
    )
    clear = [d for d in report.differences if d["ci_low"] is not None and (d["ci_low"] > 0 or d["ci_high"] < 0)]
    if clear:
        parts.append("<h3>Differences whose interval excludes 0</h3>")
        parts.append(
            table(
                ["metric", "a − b", "difference", "interval"],
                [
                    (
                        d["metric"],
                        f"{d['a']} − {d['b']}",
                        f"{d['difference']:+.4f}",
                        f"[{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]",
                    )
                    for d in clear
                ],
            )
        )
    if report.curves:
        png = curves_png(report.curves, **report.curve_axes)
        what = "MoRF / LeRF" if report.unit == "texts" else "deletion / insertion"
        parts.append(figure(png, f"Mean {what} curves over the {report.unit}", chart=True))
    parts += [_text_sample(report, s) for s in report.samples[:SAMPLES_SHOWN]]
    return "".join(parts)


SAMPLES_SHOWN = 4  # texts whose token strips and curves a report shows (every one is in results.json)


def _text_sample(report: Any, sample: dict) -> str:
    """One text: each method's token strip beside its MoRF and LeRF curves."""
    from gradscope.render.curves import curves_png
    from gradscope.render.positions import token_strip

    parts = [f"<h3>{esc(sample['key'])} (target {esc(sample.get('class'))})</h3>"]
    curves = sample["curves"]
    for method, scores in sample["maps"].items():
        if not scores:
            continue
        strip = token_strip(sample["tokens"], scores, width=560)
        panels = {f"{method}: MoRF / LeRF": {n: curves[n].get(method, []) for n in ("morf", "lerf")}}
        chart = curves_png(panels, panel_size=(300, 160), **report.curve_axes)
        parts.append(figure(strip, f"{method}: token map", chart=True) + figure(chart, "", chart=True))
    return "".join(parts)


def evaluation_html(report: Any) -> str:
    return fragment(evaluation_body(report))


# ----------------------------------------------------------------------------------------------- gradient flow
def flow_body(report: Any, baseline: Any = None, baseline_name: str = "") -> str:
    from gradscope.engine.diagnostics.flow import flow_picture

    flagged = [f"{r.node}: {' '.join(r.flags)}" for r in report.flagged()]
    caption = f"Gradient flow of {report.model_name}, target {report.target}"
    if report.loss_value is not None:
        caption += f" (loss {report.loss_value:.6g})"
    return alerts(flagged, ok="no node flagged") + figure(
        flow_picture(report, baseline, baseline_name), caption, chart=True
    )


def flow_html(report: Any) -> str:
    return fragment(flow_body(report))


# ----------------------------------------------------------------------------------------------- training log
def _loss_series(log: Any) -> tuple[list[int], list[float]]:
    if log.norms is not None and len(log.norms):
        return [int(s) for s in log.norms.steps], [float(v) for v in log.norms.loss]
    return [r.step for r in log.records], [float(r.loss) for r in log.records]


_ALERT_NAMES = {"nonfinite": "first NaN/Inf", "spike": "loss spike"}


def training_body(log: Any, *, live: bool = False) -> str:
    """The log's alerts, its loss, its heat map and its last record's flow over its first."""
    from gradscope.engine.training.report import step_flow, stopped_before_first_record, training_alerts
    from gradscope.render.charts import heatmap_picture, series_picture

    title = f"Gradient flow in training: {log.model_name} ({len(log.records)} records, every {log.every} steps)"
    parts = [f"<h3>{esc(title)}</h3>"]
    if log.failure:
        parts.append(alerts([f"the monitor recorded nothing: {log.failure}"]))
    before = stopped_before_first_record(log)
    if before:
        parts.append(alerts([before]))
    found = training_alerts(log) if log.records else []
    first_bad = next((a for a in found if a.kind == "nonfinite"), None)
    lines = []
    for a in found:
        where = f" in {a.node}" if a.node else ""
        op = f" (op {a.op})" if a.op else ""
        kind = _ALERT_NAMES.get(a.kind, a.kind.replace("_", " "))
        lines.append(f"step {a.first_step}: {kind}{where}{op} — {a.detail}")
    parts.append(alerts(lines, ok="no alert: every record finite, no layer vanishing or exploding, no loss spike"))
    if problems := list(log.problems):
        parts.append("".join(f"<div class='note'>{esc(p)}</div>" for p in problems[:5]))
    steps, loss = _loss_series(log)
    spikes = [a.first_step for a in found if a.kind == "spike"]
    stop_text = ""
    if first_bad is not None:
        stop_text = f"first NaN/Inf: step {first_bad.first_step}" + (f" in {first_bad.node}" if first_bad.node else "")
    loss_picture = series_picture(
        steps,
        loss,
        title="loss" + (" (red rings: gradient-norm spikes)" if spikes else ""),
        marks=spikes,
        stop=first_bad.first_step if first_bad is not None else None,
        stop_text=stop_text,
    )
    parts.append(
        figure(
            loss_picture,
            f"Loss over {len(steps)} steps" + (f"; red line: {stop_text}" if stop_text else ""),
            chart=True,
        )
    )
    if log.records:
        names = [n.id for n in log.nodes]
        matrix = log.matrix("grad_mean_abs")
        what = "RMS of g" if log.statistics == "magnitude" else "mean |g|"
        heat = heatmap_picture(matrix, names, log.steps, title=f"{what} per layer (rows) and record (columns)")
        parts.append(figure(heat, f"{what} of every node's gradient at each recorded step", chart=True))
        finite = [r for r in log.records if r.finite] or log.records
        first, last = finite[0], finite[-1]  # the flow of a NaN record is NaN everywhere: the last before it
        if last is not log.records[-1]:
            parts.append(f"<div class='note'>The flow below is of step {last.step}, the last finite record.</div>")
        baseline = step_flow(log, first) if first is not last else None
        parts.append(flow_body(step_flow(log, last), baseline, f"step {first.step}"))
    if live:
        parts.append("<div class='note'>updating while fit runs…</div>")
    return "".join(parts)


def training_html(log: Any) -> str:
    return fragment(training_body(log))


# ----------------------------------------------------------------------------------------------- layer graph
def graph_html(picture: Any) -> str:
    body = f'<div class="scroll">{picture.svg()}</div>'
    if picture.flow is not None:
        body = flow_body(picture.flow) + body
    else:
        body += "<div class='note'>pass inputs= to colour each layer by its gradient</div>"
    return fragment(body)


def layer_graph_html(graph: Any) -> str:
    """A ``LayerGraph`` laid out as the window opens it (large graphs as their blocks), as SVG."""
    from gradscope.render.graph_layout import compute_layout, default_collapsed
    from gradscope.render.graph_svg import graph_svg

    svg = graph_svg(compute_layout(graph, default_collapsed(graph)), title=graph.model_name)
    note = f"{len(graph)} nodes; gs.graph(model, inputs) colours each by its gradient"
    return fragment(f'<div class="scroll">{svg}</div><div class="note">{esc(note)}</div>')


def engine_html(engine: Any) -> str:
    return layer_graph_html(engine.graph)


# ----------------------------------------------------------------------------------------------- results, plans
MAX_ROWS = 400  # a table longer than this says how many rows it left out


def backward_result_html(result: Any) -> str:
    """A backward pass: what it explained, its warnings and every node's statistics (the flow table)."""
    rows = [
        (
            r["node"],
            r["rule"],
            r["status"],
            _num(r["mean_abs"]),
            _num(r["max_abs"]),
            "" if math.isnan(r["zero_fraction"]) else f"{r['zero_fraction']:.0%}",
            r["nan_count"] or "",
            r["inf_count"] or "",
        )
        for r in result.flow_table()
    ]
    head = f"{len(result.input_grads)} input signal(s) of shape {tuple(result.input_grads[0].shape)}"
    if result.target_indices.size:
        head += f"; target index {', '.join(str(int(i)) for i in result.target_indices[:8])}"
    if result.rules:
        head += f"; {len(result.rules)} node(s) under a rule"
    parts = [f"<div class='note'>{esc(head)}</div>", alerts(result.warnings())]
    parts.append(table(["node", "rule", "status", "mean |g|", "max |g|", "zero", "NaN", "Inf"], rows[:MAX_ROWS]))
    if len(rows) > MAX_ROWS:
        parts.append(f"<div class='note'>… {len(rows) - MAX_ROWS} more nodes (flow_table() has them all)</div>")
    return fragment("".join(parts))


def plan_html(plan: Any) -> str:
    """A plan's entries in order (a later entry wins where two select one node)."""
    if not plan.entries:
        return fragment("<div class='note'>An empty plan: the true gradient everywhere.</div>")
    rows = [
        (i, e.select, e.rule, json.dumps(e.params, sort_keys=True) if e.params else "")
        for i, e in enumerate(plan.entries)
    ]
    title = f"<h3>{esc(plan.name)}</h3>" if plan.name else ""
    note = "<div class='note'>later entries win where two select the same node</div>"
    return fragment(title + table(["#", "selects", "rule", "parameters"], rows) + note)
