"""The supported TensorFlow/Keras range: older is refused with the fix, newer is warned about, and the
running pair is inside it (it is what the suite runs on)."""

from __future__ import annotations

from gradscope.backend import SUPPORTED_KERAS, SUPPORTED_TENSORFLOW, keras, tf, version_problem, version_tuple


def test_versions_are_read_as_numbers():
    assert version_tuple("3.15.1") == (3, 15, 1) and version_tuple("2.21.0rc1", 2) == (2, 21)
    assert version_tuple("3") == (3, 0, 0) and version_tuple("3.9.2") < version_tuple("3.10.0")


def test_older_is_refused_with_the_fix_and_newer_is_a_warning():
    fatal, message = version_problem("Keras", "3.9.2", SUPPORTED_KERAS)
    assert fatal and "pip install 'keras>=3.10'" in message
    fatal, message = version_problem("TensorFlow", "2.30.0", SUPPORTED_TENSORFLOW)
    assert not fatal and "tested with TensorFlow 2.19-2.21" in message
    assert version_problem("TensorFlow", tf.__version__, SUPPORTED_TENSORFLOW) == (False, "")
    assert version_problem("Keras", keras.__version__, SUPPORTED_KERAS) == (False, "")
