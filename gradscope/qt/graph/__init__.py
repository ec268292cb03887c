"""The layer graph's view: the scene, its styles, the pane around it and the overview."""
