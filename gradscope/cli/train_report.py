"""``gradscope train-report LOGDIR``: what a GradientMonitor log says went wrong (exit 1 on a NaN/Inf)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gradscope.cli.common import add_command, distinct_outputs


def add_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "train-report",
        run,
        help="alerts of a GradientMonitor log: first NaN/Inf, vanishing/exploding layers, dead ReLUs (exit 1 on NaN)",
    )
    p.add_argument("logdir", help="the log_dir given to gradscope.GradientMonitor")
    p.add_argument("--step", type=int, help="also print the per-layer flow of this recorded step")
    p.add_argument("--run", metavar="ID", help="the run to report when the folder holds several (default: the latest)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the flow of --step (default: the last record) to FILE")
    p.add_argument("--png", metavar="FILE", help="write a chart of the flow of --step (default: the last record)")
    p.add_argument(
        "--spike",
        type=float,
        default=5.0,
        metavar="K",
        help="flag a step whose global gradient norm exceeds K x the running median of the steps before (default 5)",
    )


def run(args: Any) -> int:
    """Print the alerts of a training log; ``--step N``: also that step's per-layer flow; ``--csv``/``--png``:
    write that step's flow (the last record without ``--step``). Exit 1 when a NaN/Inf occurred."""
    from gradscope.core.errors import EXIT_USER_ERROR, InputError
    from gradscope.engine.training.report import report_text, step_flow, stopped_before_first_record, training_alerts
    from gradscope.engine.training.spikes import clipped_steps
    from gradscope.io.training_events import read_training_log

    if not (args.spike > 1.0 and math.isfinite(args.spike)):
        raise InputError(f"--spike must be a number above 1; got {args.spike:g}.")
    distinct_outputs({"--csv": args.csv, "--png": args.png}, Path(args.logdir).glob("events.out.tfevents.*"))
    log = read_training_log(args.logdir, run=args.run)
    if stopped_before_first_record(log):  # a run that ended before its first record is not one yet to come
        print(report_text(log, []))
        return EXIT_USER_ERROR
    alerts = training_alerts(log, spike=args.spike)
    step = args.step if args.step is not None else (log.steps[-1] if log.records else None)
    flow = step_flow(log, step) if step is not None and (args.step is not None or args.csv or args.png) else None
    if args.json:
        data: dict[str, Any] = {
            "folder": log.folder,
            "run": log.run_id,
            "runs": [r.__dict__ for r in log.runs],
            "problems": log.problems,
            "model_name": log.model_name,
            "every": log.every,
            "steps": log.steps,
            "loss": [r.loss for r in log.records],
            "alerts": [a.to_dict() for a in alerts],
            "replicas": log.replicas,
            "clipped": dict(zip(("by", "steps"), clipped_steps(log) or ())) or None,
            "overflow_steps": [s for s, _ in log.overflows],
        }
        if flow is not None:
            data["flow"] = flow.to_dict()
        print(json.dumps(data, indent=2, default=str))
    else:
        print(report_text(log, alerts))
        if flow is not None and args.step is not None:
            print(flow.to_text())
    if flow is not None and args.csv:
        print(f"wrote {flow.to_csv(args.csv)}")
    if flow is not None and args.png:
        print(f"wrote {flow.to_png(args.png)}")
    return 1 if any(a.kind == "nonfinite" for a in alerts) else 0
