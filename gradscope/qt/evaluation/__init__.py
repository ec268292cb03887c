"""The Evaluation view: the form and scores, the curves and the image browser."""
