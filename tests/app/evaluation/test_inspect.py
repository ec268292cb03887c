"""Looking at one evaluated image: each method's map, its pointing point and hit are those the evaluation
scored (per_image.csv), for the bundled dataset and the demo model."""

from __future__ import annotations

import numpy as np

from gradscope.api import evaluate, open_engine
from gradscope.app.evaluation.inspect import inspect_image
from gradscope.app.evaluation.run import evaluation_settings, source_of
from gradscope.core.resources import resource_path
from gradscope.engine.evaluation import faithfulness as fm
from gradscope.io.demo import demo_model_path


def test_an_inspected_image_shows_the_points_and_hits_the_evaluation_scored(tmp_path):
    engine = open_engine(demo_model_path())
    data = resource_path("demo", "eval")
    methods, tolerance = ["gradient", "cmwp", "center", "random"], 4.0
    report = evaluate(engine, data, methods=methods, metrics=["pointing"], tolerance=tolerance, out=tmp_path / "e")
    settings = evaluation_settings(methods, ["pointing"], None, tolerance=tolerance)
    source = source_of(engine, data, settings)
    scored = {(r["key"], r["method"]): r["pointing"] for r in report.per_image}
    for key in source.keys()[:6]:
        seen = inspect_image(engine, source, settings, key)
        sample = source.load(key)
        assert seen.cls == sample.classes()[0] and seen.image.dtype == np.uint8
        assert seen.image.shape[:2] == seen.mask.shape == sample.mask.shape
        assert [v.method for v in seen.views] == methods
        for view in seen.views:
            assert view.heat.shape == seen.image.shape and view.saliency.shape == seen.mask.shape
            if view.method == "random":  # scored as the expected hit rate: no point to show
                assert view.point is None and view.hit is None
                continue
            assert view.hit == bool(scored[key, view.method])
            assert view.hit == fm.pointing_hit(view.point, seen.mask == seen.cls, tolerance)
