"""The Patching view (``panel.PatchingPanel``)."""
