"""Read a ``GradientMonitor`` log folder back, also while training still writes it.

Event files are TFRecord files of ``Event`` protos (what TensorBoard reads). ``TrainingLogReader`` keeps, per
file, the offset up to which it has read; a record the writer has not finished (its length or body cut short)
is left for the next ``update``, so polling a folder that a running ``fit`` writes never sees half a record.
Only the gradscope plugin's events are decoded; scalars and histograms are TensorBoard's to show (and
``histogram`` reads one when a node's distribution is asked for).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from gradscope.core.errors import InputError
from gradscope.core.json_text import parse_json
from gradscope.core.training_log import (
    ALERT_TAG,
    CHECKPOINT_TAG,
    LOSS_TAG,
    META_TAG,
    NODE_COLUMNS,
    NODES_TAG,
    NORMS_TAG,
    OVERFLOW_TAG,
    WEIGHTS_TAG,
    LogNode,
    LogWeight,
    RunInfo,
    StepNorms,
    StepRecord,
    TrainingLog,
)

_EVENT_GLOB = "events.out.tfevents.*"
_OWN_TAGS = (META_TAG, ALERT_TAG, CHECKPOINT_TAG, NODES_TAG, WEIGHTS_TAG, LOSS_TAG, NORMS_TAG, OVERFLOW_TAG)


def masked_crc(data: bytes) -> int:
    """TFRecord's checksum: CRC32C, rotated right by 15 bits, plus a constant (so that a CRC of CRCs differs)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _records(data: bytes, start: int) -> tuple[list[tuple[int, bytes | None]], int, str | None]:
    """(offset, body) of the complete TFRecords in ``data`` from ``start``; the offset after the last one; what
    is damaged, if anything. A record is a little-endian u64 length, its masked CRC32C (u32), the body and the
    body's masked CRC32C. A body whose checksum fails is returned as None (named and skipped by the caller); a
    length whose checksum fails ends the file's reading (nothing after it can be found)."""
    out: list[tuple[int, bytes | None]] = []
    pos = start
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        (length_crc,) = struct.unpack_from("<I", data, pos + 8)
        if masked_crc(data[pos : pos + 8]) != length_crc:
            return out, len(data), f"the record at byte {pos} has a damaged length; the rest of the file is skipped"
        end = pos + 12 + length + 4
        if end > len(data):
            break  # the writer has not finished it: the next update reads it
        body = data[pos + 12 : pos + 12 + length]
        (body_crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        out.append((pos, body if masked_crc(body) == body_crc else None))
        pos = end
    return out, pos, None


def _tensor(value: Any) -> np.ndarray:
    from gradscope.backend import tf

    return tf.make_ndarray(value.tensor)


def _json_of(value: Any) -> Any:
    return parse_json(_tensor(value).item(), "a gradscope event", InputError)


@dataclass
class _Run:
    """What one run (one monitor's meta and the events after it in its file) wrote."""

    id: str
    meta: dict
    started: float
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    alerts: list[dict] = field(default_factory=list)
    checkpoints: dict[str, int] = field(default_factory=dict)
    histograms: dict[tuple[str, int], tuple[Path, int]] = field(default_factory=dict)  # (tag, step) -> where
    norms: dict[int, np.ndarray] = field(default_factory=dict)  # step -> [loss, global norm, variable norms...]
    overflows: list[tuple[int, float]] = field(default_factory=list)  # (step, the loss scale) per skipped update


class TrainingLogReader:
    """Incremental reader of one log folder: ``update()`` reads what was appended since the last call. Runs are
    kept apart (a folder two processes logged into holds two); ``log()`` returns the latest unless asked for
    another. Every record's checksum is verified: a damaged one is named in ``problems`` and skipped."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise InputError(f"{self.folder} is not a folder (expected a GradientMonitor log_dir).")
        self._offsets: dict[Path, int] = {}
        self._runs: dict[str, _Run] = {}
        self._file_run: dict[Path, _Run] = {}  # the run whose events a file holds now (its last meta)
        self._histogram_tags: set[str] = set()
        self.problems: list[str] = []

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
            bodies, end, damage = _records(data, start)
            self._offsets[path] = end
            if damage:
                self.problems.append(f"{path.name}: {damage}")
            for offset, body in bodies:
                if body is None:
                    self.problems.append(f"{path.name}: the record at byte {offset} fails its checksum; skipped")
                    continue
                try:
                    event = tf.compat.v1.Event.FromString(body)
                    for value in event.summary.value:
                        changed |= self._take(event, value, path, offset)
                except Exception as exc:  # noqa: BLE001 - a record that passed its checksum yet does not decode
                    self.problems.append(f"{path.name}: the record at byte {offset} does not decode ({exc}); skipped")
        return changed

    def _take(self, event: Any, value: Any, path: Path, offset: int) -> bool:
        # The writer sends a tag's metadata (its plugin) with the tag's first event only: remember the tags.
        tag, step = value.tag, int(event.step)
        plugin = value.metadata.plugin_data.plugin_name
        if plugin == "histograms":
            self._histogram_tags.add(tag)
        if tag == META_TAG:
            meta = _json_of(value)
            run_id = str((meta.get("run") or {}).get("id") or f"file {path.name}")  # logs before run ids
            run = self._runs.get(run_id)
            if run is None:
                run = self._runs[run_id] = _Run(run_id, meta, float(event.wall_time))
            run.meta = meta
            self._file_run[path] = run
            return True
        run = self._file_run.get(path)
        if run is None:
            return False  # events before any meta: not a gradscope log's
        if tag in self._histogram_tags:
            run.histograms[(tag, step)] = (path, offset)
            return False
        if tag == ALERT_TAG:
            run.alerts.append(_json_of(value))
        elif tag == CHECKPOINT_TAG:
            run.checkpoints[_json_of(value)["name"]] = step
        elif tag == NORMS_TAG:
            run.norms[step] = _tensor(value).astype(np.float64).ravel()
        elif tag == OVERFLOW_TAG:
            run.overflows.append((step, float(np.ravel(_tensor(value))[0])))
        elif tag in (NODES_TAG, WEIGHTS_TAG, LOSS_TAG):
            entry = run.steps.setdefault(step, {"wall_time": event.wall_time})
            entry[tag] = _tensor(value)
        else:
            return False
        return True

    def runs(self) -> list[RunInfo]:
        """Every run in the folder, oldest first."""
        return [
            RunInfo(r.id, r.started, str(r.meta.get("model_name", "model")), len(r.steps))
            for r in sorted(self._runs.values(), key=lambda r: r.started)
        ]

    def _run(self, run: str | None) -> _Run:
        if not self._runs:
            raise InputError(
                f"{self.folder} has no gradscope training log yet (no GradientMonitor events): pass the log_dir "
                "given to GradientMonitor."
            )
        if run is None:
            return max(self._runs.values(), key=lambda r: r.started)
        found = [r for r in self._runs.values() if r.id.startswith(run)]
        if len(found) != 1:
            known = ", ".join(r.id for r in self._runs.values())
            raise InputError(
                f"{'No' if not found else 'More than one'} run {run!r} in {self.folder}; its runs: {known}."
            )
        return found[0]

    def log(self, run: str | None = None) -> TrainingLog:
        """The latest run's log (or the run whose id starts with ``run``)."""
        chosen = self._run(run)
        meta = chosen.meta
        nodes = [
            LogNode(n["id"], n.get("layer"), n.get("op_type", ""), tuple(n.get("inputs", ())), n.get("activation"))
            for n in meta.get("nodes", [])
        ]
        weights = [LogWeight(w["path"], w.get("node"), tuple(w.get("shape", ()))) for w in meta.get("weights", [])]
        records = []
        for step in sorted(chosen.steps):
            entry = chosen.steps[step]
            if not all(tag in entry for tag in (NODES_TAG, WEIGHTS_TAG, LOSS_TAG)):
                continue  # cut short, or a part skipped as damaged: never a record with a made-up NaN loss
            node_rows, weight_rows = entry[NODES_TAG], entry[WEIGHTS_TAG]
            if node_rows.shape != (len(nodes), len(NODE_COLUMNS)) or weight_rows.shape[0] != len(weights):
                continue
            loss_row = np.atleast_1d(entry[LOSS_TAG])
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
            alerts=list(chosen.alerts),
            plan=meta.get("plan"),
            before_weights=list(meta.get("before_weights", [])),
            statistics=meta.get("statistics", "all"),
            checkpoints=sorted(chosen.checkpoints.items(), key=lambda item: item[1]),
            run_id=chosen.id,
            runs=self.runs(),
            failure=meta.get("failure"),
            problems=list(self.problems),
            cut_bytes=self._cut_bytes(),
            norms=_step_norms(chosen.norms, len(weights)),
            overflows=list(chosen.overflows),
            clipping=dict(meta.get("clipping") or {}),
            replicas=int(meta.get("replicas", 1)),
            writer=dict(meta.get("run") or {}),
        )

    def _cut_bytes(self) -> int:
        """Bytes past the last whole record of each file: a record the writer is still writing, or one cut short
        for good (a full disk, a process killed mid-write) once its writer is gone."""
        cut = 0
        for path, offset in self._offsets.items():
            try:
                cut += max(path.stat().st_size - offset, 0)
            except OSError:
                continue
        return cut

    def histogram(self, tag: str, step: int, run: str | None = None) -> np.ndarray | None:
        """The (buckets, 3) [left, right, count] histogram TensorBoard shows for ``tag`` at ``step`` (None: none,
        or its record is damaged)."""
        from gradscope.backend import tf

        if not self._runs:
            return None
        where = self._run(run).histograms.get((tag, step))
        if where is None:
            return None
        path, offset = where
        with path.open("rb") as f:
            f.seek(offset)
            head = f.read(12)
            (length,) = struct.unpack_from("<Q", head, 0)
            body = f.read(length)
            crc = f.read(4)
        if len(body) != length or len(crc) != 4 or masked_crc(body) != struct.unpack("<I", crc)[0]:
            return None
        event = tf.compat.v1.Event.FromString(body)
        for value in event.summary.value:
            if value.tag == tag:
                return _tensor(value)
        return None


def _step_norms(by_step: dict[int, np.ndarray], n_weights: int) -> StepNorms | None:
    """The per-step norms in step order (a step written twice, as a loss scaler's skipped one is: the last)."""
    rows = [(step, row) for step, row in sorted(by_step.items()) if row.size == 2 + n_weights]
    if not rows:
        return None
    table = np.stack([row for _, row in rows])
    return StepNorms(np.array([s for s, _ in rows], np.int64), table[:, 0], table[:, 1], table[:, 2:])


def read_training_log(folder: str | Path, run: str | None = None) -> TrainingLog:
    reader = TrainingLogReader(folder)
    reader.update()
    return reader.log(run)
