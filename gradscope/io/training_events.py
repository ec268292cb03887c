"""Read a ``GradientMonitor`` log folder back, also while training still writes it.

Event files are TFRecord files of ``Event`` protos (what TensorBoard reads). ``TrainingLogReader`` keeps, per
file, the offset up to which it has read; a record the writer has not finished (its length or body cut short)
is left for the next ``update``, so polling a folder that a running ``fit`` writes never sees half a record.
Only the gradscope plugin's events are decoded; scalars and histograms are TensorBoard's to show (and
``histogram`` reads one when a node's distribution is asked for).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import InputError
from gradscope.core.training_log import (
    ALERT_TAG,
    CHECKPOINT_TAG,
    LOSS_TAG,
    META_TAG,
    NODE_COLUMNS,
    NODES_TAG,
    WEIGHT_COLUMNS,
    WEIGHTS_TAG,
    LogNode,
    LogWeight,
    StepRecord,
    TrainingLog,
)

_EVENT_GLOB = "events.out.tfevents.*"
_OWN_TAGS = (META_TAG, ALERT_TAG, CHECKPOINT_TAG, NODES_TAG, WEIGHTS_TAG, LOSS_TAG)


def _records(data: bytes, start: int) -> tuple[list[tuple[int, bytes]], int]:
    """(offset, body) of the complete TFRecords in ``data`` from ``start``; the offset after the last one.
    A record is a little-endian u64 length, its u32 CRC, the body and the body's u32 CRC."""
    out, pos = [], start
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length + 4
        if end > len(data):
            break
        out.append((pos, data[pos + 12 : pos + 12 + length]))
        pos = end
    return out, pos


def _tensor(value: Any) -> np.ndarray:
    from gradscope.backend import tf

    return tf.make_ndarray(value.tensor)


class TrainingLogReader:
    """Incremental reader of one log folder: ``update()`` reads what was appended since the last call."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise InputError(f"{self.folder} is not a folder (expected a GradientMonitor log_dir).")
        self._offsets: dict[Path, int] = {}
        self._meta: dict | None = None
        self._steps: dict[int, dict[str, Any]] = {}
        self._alerts: list[dict] = []
        self._checkpoints: dict[str, int] = {}
        self._histogram_tags: set[str] = set()
        self._histograms: dict[tuple[str, int], tuple[Path, int]] = {}  # (tag, step) -> where its record is

    def files(self) -> list[Path]:
        return sorted(self.folder.glob(_EVENT_GLOB))

    def update(self) -> bool:
        """Read new events; True when something new arrived."""
        from gradscope.backend import tf

        changed = False
        for path in self.files():
            start = self._offsets.get(path, 0)
            try:
                if path.stat().st_size <= start:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            bodies, end = _records(data, start)
            self._offsets[path] = end
            for offset, body in bodies:
                event = tf.compat.v1.Event.FromString(body)
                for value in event.summary.value:
                    changed |= self._take(event, value, path, offset)
        return changed

    def _take(self, event: Any, value: Any, path: Path, offset: int) -> bool:
        # The writer sends a tag's metadata (its plugin) with the tag's first event only: remember the tags.
        tag, step = value.tag, int(event.step)
        plugin = value.metadata.plugin_data.plugin_name
        if plugin == "histograms":
            self._histogram_tags.add(tag)
        if tag in self._histogram_tags:
            self._histograms[(tag, step)] = (path, offset)
            return False
        if tag not in _OWN_TAGS:
            return False
        if tag == META_TAG:
            meta = json.loads(_tensor(value).item().decode())
            if self._meta is not None and [n["id"] for n in meta["nodes"]] != [n["id"] for n in self._meta["nodes"]]:
                self._steps.clear()  # another model trained into the same folder: its records replace these
                self._alerts.clear()
            self._meta = meta
        elif tag == ALERT_TAG:
            self._alerts.append(json.loads(_tensor(value).item().decode()))
        elif tag == CHECKPOINT_TAG:
            self._checkpoints[json.loads(_tensor(value).item().decode())["name"]] = step
        elif tag in (NODES_TAG, WEIGHTS_TAG, LOSS_TAG):
            entry = self._steps.setdefault(step, {"wall_time": event.wall_time})
            entry[tag] = _tensor(value)
        else:
            return False
        return True

    def log(self) -> TrainingLog:
        if self._meta is None:
            raise InputError(
                f"{self.folder} has no gradscope training log yet (no GradientMonitor events): pass the log_dir "
                "given to GradientMonitor."
            )
        meta = self._meta
        nodes = [
            LogNode(n["id"], n.get("layer"), n.get("op_type", ""), tuple(n.get("inputs", ())), n.get("activation"))
            for n in meta["nodes"]
        ]
        weights = [LogWeight(w["path"], w.get("node"), tuple(w.get("shape", ()))) for w in meta["weights"]]
        records = []
        for step in sorted(self._steps):
            entry = self._steps[step]
            node_rows = entry.get(NODES_TAG, np.zeros((0, len(NODE_COLUMNS))))
            weight_rows = entry.get(WEIGHTS_TAG, np.zeros((0, len(WEIGHT_COLUMNS))))
            if node_rows.shape != (len(nodes), len(NODE_COLUMNS)) or weight_rows.shape[0] != len(weights):
                continue  # a step of an older run whose model differed, or one cut short
            loss_row = np.atleast_1d(entry.get(LOSS_TAG, np.array([np.nan, 0.0])))
            data_bad = float(loss_row[1]) if loss_row.size > 1 else 0.0
            records.append(
                StepRecord(step, float(entry["wall_time"]), node_rows, weight_rows, float(loss_row[0]), data_bad)
            )
        return TrainingLog(
            folder=str(self.folder),
            model_name=meta.get("model_name", "model"),
            nodes=nodes,
            weights=weights,
            output_nodes=list(meta.get("outputs", [])),
            every=int(meta.get("every", 1)),
            records=records,
            alerts=list(self._alerts),
            plan=meta.get("plan"),
            before_weights=list(meta.get("before_weights", [])),
            statistics=meta.get("statistics", "all"),
            checkpoints=sorted(self._checkpoints.items(), key=lambda item: item[1]),
        )

    def histogram(self, tag: str, step: int) -> np.ndarray | None:
        """The (buckets, 3) [left, right, count] histogram TensorBoard shows for ``tag`` at ``step`` (None: none)."""
        from gradscope.backend import tf

        where = self._histograms.get((tag, step))
        if where is None:
            return None
        path, offset = where
        with path.open("rb") as f:
            f.seek(offset)
            head = f.read(12)
            (length,) = struct.unpack_from("<Q", head, 0)
            event = tf.compat.v1.Event.FromString(f.read(length))
        for value in event.summary.value:
            if value.tag == tag:
                return _tensor(value)
        return None


def read_training_log(folder: str | Path) -> TrainingLog:
    reader = TrainingLogReader(folder)
    reader.update()
    return reader.log()
