"""Dataset evaluation's engine side: maps of many images at once and the faithfulness metrics. May import
engine.backward; never engine.training."""
