"""Patching from the window and beyond one process: the evented model the Patching view shows (``model``) and a
large grid's exact rows on a Ray cluster (``on_ray``)."""
