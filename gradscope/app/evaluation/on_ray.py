"""The evaluation's batches on a Ray cluster: Ray Data ``map_batches`` over the batch list with an actor pool, each
actor holding one engine (the model loaded once per actor; a GPU each when the cluster has them).

The batches are the ones ``run_batches`` computes, cut the same way and scored by the same function, so a Ray
run writes the same records (and resumes the same way): only where they are computed changes. Ray is an optional
extra (``pip install 'gradscope[ray]'``); nothing else imports this module.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradscope.app.evaluation.records import (
    BatchClock,
    Progress,
    RunState,
    batch_path,
    batch_record,
    load_samples,
    pending_batches,
)
from gradscope.app.evaluation.scoring import EvalSettings, EvaluationError, eval_methods
from gradscope.core.files import write_text_atomic

MAX_LOCAL_ACTORS = 8


@dataclass(frozen=True)
class RayOptions:
    """Where and how: ``address`` None starts a local Ray instance (``ray://HOST:10001`` or ``"auto"`` joins a
    cluster); ``model`` the model file every actor loads (with ``safe_mode``, ``custom_objects`` and ``rules``
    files, which run in each worker as they do here); ``actors``: the pool's size (default: one per CPU of the
    cluster, at most 8, or one per GPU)."""

    address: str | None = None
    model: str = ""
    safe_mode: bool = True
    custom_objects: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    actors: int | None = None
    num_cpus: int | None = None  # of a local instance (None: Ray's choice, all of them)


def worker_engine(options: RayOptions) -> Any:
    """The engine a Ray actor holds: the user's rule and custom-object files run in the worker as they did here,
    then the model file is loaded once."""
    from gradscope.engine.backward.runner import Engine
    from gradscope.io.models import load_custom_objects_file, load_model
    from gradscope.rules.base import load_rule_file

    for path in options.rules:
        load_rule_file(path)
    objects: dict = {}
    for path in options.custom_objects:
        objects.update(load_custom_objects_file(path))
    return Engine(load_model(options.model, safe_mode=options.safe_mode, custom_objects=objects or None))


@contextlib.contextmanager
def ray_started(options: RayOptions, error: type[Exception]) -> Iterator[Any]:
    """Ray, connected to ``options.address`` (or a local instance) unless this process already is; the connection
    this block made is closed at its end. ``error``: what an unreachable cluster is reported as."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(
                address=options.address,
                num_cpus=options.num_cpus if options.address is None else None,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        except Exception as exc:  # an unreachable cluster, a local instance that cannot start
            raise error(f"Cannot start or reach Ray ({options.address or 'local'}): {exc}") from exc
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def actor_rows(ray: Any, options: RayOptions, rows: list[dict], worker: type, arguments: dict) -> Any:
    """``rows`` mapped one at a time by a pool of ``worker(**arguments)`` actors (``options.actors``, else one per
    GPU of the cluster, else one per CPU up to ``MAX_LOCAL_ACTORS``; never more than rows), as a Ray dataset."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    actors = options.actors or (gpus or min(MAX_LOCAL_ACTORS, max(1, int(resources.get("CPU", 1)))))
    return ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
        worker,
        fn_constructor_kwargs=arguments,
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=max(1, min(actors, len(rows)))),
        num_gpus=1 if gpus else 0,
        num_cpus=0 if gpus else 1,
    )


class BatchWorker:
    """A Ray Data actor: one engine, one batch record per row (rows: ``index`` and the batch's ``keys``)."""

    def __init__(self, options: RayOptions, settings: dict, source: Any) -> None:
        self.engine = worker_engine(options)
        self.settings = EvalSettings(**settings)
        self.methods = eval_methods(self.engine, self.settings)
        self.engine.trace_cache_size = max(self.engine.trace_cache_size, len(self.methods) + 1)
        self.source = source

    def __call__(self, rows: dict) -> dict:
        import numpy as np

        docs = []
        for index, keys_json in zip(rows["index"], rows["keys"]):
            keys = json.loads(str(keys_json))
            loaded = load_samples(self.source, keys)
            docs.append(
                json.dumps(
                    batch_record(self.engine, self.methods, self.settings, int(index), keys, loaded, self.source)
                )
            )
        return {"index": np.asarray(rows["index"]), "doc": np.asarray(docs, dtype=object)}


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EvaluationError("Ray is not installed: pip install 'gradscope[ray]' (or run without --ray).") from None
    return ray


def run_batches_ray(
    options: RayOptions,
    source: Any,
    settings: EvalSettings,
    out: Path,
    keys: list[str],
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RunState:
    """``run_batches`` on Ray: the batches not on disk yet, written by this process as they arrive."""
    import_ray()  # a missing Ray is said even when every batch is on disk already
    chunks, todo, state = pending_batches(keys, settings, out)
    if not todo:
        return state
    clock = None
    with ray_started(options, EvaluationError) as ray:
        try:
            rows = [{"index": i, "keys": json.dumps(chunks[i])} for i in todo]
            arguments = {"options": options, "settings": settings.to_dict(), "source": source}
            clock = BatchClock(state.images_done, len(keys), progress)
            for row in actor_rows(ray, options, rows, BatchWorker, arguments).iter_rows():
                if should_stop is not None and should_stop():
                    raise KeyboardInterrupt
                index = int(row["index"])
                write_text_atomic(batch_path(out, index), str(row["doc"]))
                state.computed += 1
                clock.add(len(chunks[index]))
        except KeyboardInterrupt:
            state.stopped = True
    state.seconds = clock.seconds if clock is not None else 0.0
    return state
