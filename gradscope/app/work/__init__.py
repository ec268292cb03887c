"""The one TensorFlow thread and what runs on it: the worker, the run of a plan as a job, the heap around a
loaded model. May import app.rendering."""
