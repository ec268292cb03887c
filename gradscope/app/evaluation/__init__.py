"""Evaluating methods over a dataset: settings and scoring, batches and their records, the local and the Ray run,
the report. Imports no other app package."""
