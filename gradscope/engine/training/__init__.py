"""Training: ``GradientMonitor`` (the monitored train step and its event log), ``plan_model`` and the report
of a training log. May import engine.backward and engine.diagnostics; never engine.evaluation."""
