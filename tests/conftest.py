"""Shared test setup: quiet TensorFlow, offscreen Qt, seeded randomness."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
