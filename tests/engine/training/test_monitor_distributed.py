"""GradientMonitor under MirroredStrategy (two logical CPUs, in a process of its own: distributed_run.py): the
records are of the global batch (equal to one device's on the same batches and weights), one writer, and a NaN
is traced to the replica whose shard made it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).with_name("distributed_run.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("distributed")
    done = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.parametrize("model", ["mlp", "text"])  # dense gradients; an Embedding's sparse one
def test_mirrored_records_equal_one_device_records_of_the_same_global_batch(runs, model):
    one, two = runs[f"{model}_one"], runs[f"{model}_two"]
    assert two["replicas"] == 2 and one["replicas"] == 1
    assert one["steps"] == two["steps"] == [0, 1, 2, 3]
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)
    np.testing.assert_allclose(two["history"], one["history"], rtol=1e-5)  # Keras' own logs unchanged
    np.testing.assert_allclose(two["norms"], one["norms"], rtol=1e-5)
    # every node statistic (norm, mean|g|, max|g|, zero fraction, NaN, Inf, none, values, dead units, size)
    np.testing.assert_allclose(np.array(two["nodes"]), np.array(one["nodes"]), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.array(two["weights"]), np.array(one["weights"]), rtol=1e-5, atol=1e-7)
    assert two["event_files"] == 1  # one writer
    assert "2 replicas in sync" in two["report"]


def test_a_nan_in_one_replicas_shard_names_that_replica(runs):
    run = runs["nan_two"]
    (alert,) = run["monitor_alerts"]
    assert alert["step"] == 1 and alert["replica"] == 1
    nonfinite = [a for a in run["alerts"] if a["kind"] == "nonfinite"]
    assert nonfinite and nonfinite[0]["first_step"] == 1
    assert "it started on replica 1 of 2" in run["report"]
    assert "the batch itself has" in run["report"]  # the replay recorded replica 1's shard, NaN input included
