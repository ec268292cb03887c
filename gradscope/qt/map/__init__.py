"""The map pane: the input, map and overlay panels, their read-out controls, a language model's next token."""
