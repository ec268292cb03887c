"""Exact patching of a large grid on a Ray cluster: the grid's (component, block) rows handed to an actor pool with
Ray Data ``map_batches``, each actor holding one engine (the model loaded once per actor; a GPU each when the
cluster has them) and computing its rows with the same ``patch_effects`` on the same inputs, so the grid equals the
local run's. The estimates, when asked for beside it, are computed here (one backward pass). Ray is an optional
extra (``pip install 'gradscope[ray]'``); nothing else imports this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gradscope.app.evaluation.on_ray import RayOptions, actor_rows, ray_started, worker_engine
from gradscope.core.errors import GradscopeError
from gradscope.core.patching import PatchResult, agreement
from gradscope.core.targets import Target


class RowWorker:
    """A Ray Data actor: one engine; each row ``(component, block)`` of the grid patched exactly."""

    def __init__(self, options: RayOptions, job: dict) -> None:
        self.engine = worker_engine(options)
        self.job = job

    def __call__(self, rows: dict) -> dict:
        from gradscope.engine.patching import patch_effects

        job, out = self.job, []
        for component, block in zip(rows["component"], rows["block"]):
            result = patch_effects(
                self.engine, job["clean"], job["corrupt"], Target(**job["target"]), metric=job["metric"],
                components=(str(component),) if job["nodes"] is None else (), nodes=job["nodes"], method="exact",
                grid=job["grid"], only=[(str(component), int(block))],
            )  # fmt: skip
            out.append(json.dumps(result.by_component[str(component)][int(block)].tolist()))
        return {"component": np.asarray(rows["component"]), "block": np.asarray(rows["block"]),
                "effects": np.asarray(out, dtype=object)}  # fmt: skip


def patch_on_ray(
    options: RayOptions,
    engine: Any,
    clean: Sequence[Any],
    corrupt: Sequence[Any],
    target: Target,
    *,
    metric: str,
    components: tuple[str, ...],
    nodes: list[str] | None,
    method: str,
    grid: int,
    compare: bool,
    labels: Any = None,
    decode: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> PatchResult:
    """``patch_effects`` with the exact rows computed on Ray (``method`` "exact", or an estimate ``compare``d with
    exact)."""
    from gradscope.engine.patching import patch_effects

    if method != "exact" and not compare:
        raise GradscopeError(f"--ray spreads exact patches over a cluster; {method} alone is one backward pass here.")
    # the frame (nodes, units, metric) and the estimate, here; no exact row (``only=[]``)
    local = patch_effects(engine, clean, corrupt, target, metric=metric, components=components, nodes=nodes,
                          method=method if method != "exact" else "atp", grid=grid, compare=True, labels=labels,
                          decode=decode, only=[])  # fmt: skip
    rows = [{"component": c, "block": b} for c, names in local.nodes.items() for b in range(len(names))]
    job = {"clean": [np.asarray(x) for x in clean], "corrupt": [np.asarray(x) for x in corrupt],
           "target": _target_fields(target), "metric": metric, "nodes": nodes, "grid": grid}  # fmt: skip
    exact = {c: np.full_like(e, np.nan) for c, e in local.exact.items()}
    with ray_started(options, GradscopeError) as ray:
        patched = actor_rows(ray, options, rows, RowWorker, {"options": options, "job": job})
        for done, row in enumerate(patched.iter_rows(), 1):
            exact[str(row["component"])][int(row["block"])] = json.loads(str(row["effects"]))
            if progress is not None:
                progress(done, len(rows))
    if method == "exact":
        local.method, local.by_component, local.signed, local.agreement, local.exact = "exact", exact, True, {}, {}
    else:
        local.exact = exact
        local.agreement = {c: agreement(local.by_component[c], exact[c], signed=local.signed) for c in exact}
    return local


def _target_fields(target: Target) -> dict:
    return {k: getattr(target, k) for k in ("kind", "index", "node", "channel", "loss", "position", "contrast")} | (
        {"neuron": list(target.neuron)} if target.neuron is not None else {}
    )
