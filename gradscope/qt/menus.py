"""The main window's menu bar: every action, its shortcut and its status tip in one place (Help ▸ Keyboard
shortcuts reads them back from the actions)."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QAction, QKeySequence

REPORT_TIP = "One self-contained HTML page to share (what `gradscope report` writes)"


def export_report(window: Any, which: str) -> None:
    """The open training log's, or the last evaluation's, page (``gradscope report``), where the user says."""
    from gradscope.app.display.run_page import write_report

    s = window.session
    folder = s.training.folder if which == "training" else s.evaluations.out
    if folder is None:
        what = "Open a training log (File ▸ Open training log)" if which == "training" else "Run an evaluation"
        window._on_error("Nothing to report", f"{what} first.", None)
        return
    title = f"Export {which} report"
    window._export_dialog(title, f"_{which}.html", "HTML (*.html)", lambda path: write_report(folder, path).path, title)


def build_menus(window: Any) -> None:
    """File, Edit, View, Run and Help of ``window`` (a MainWindow); the actions it keeps are set on it."""
    bar = window.menuBar()
    s = window.session

    def act(menu: Any, text: str, slot: Any, shortcut: Any = None, tip: str = "") -> QAction:
        a = QAction(text, window)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
        if tip:
            a.setStatusTip(tip)
            a.setToolTip(tip)
        a.triggered.connect(slot)
        menu.addAction(a)
        return a

    f = bar.addMenu("&File")
    act(f, "Open &model…", window.open_model_dialog, QKeySequence.StandardKey.Open, "Open a .keras or .h5 model")
    act(
        f,
        "Open checkpoint &folder…",
        window.open_checkpoint_dialog,
        "Ctrl+Shift+O",
        "A Hugging Face folder (config.json + .safetensors) or a keras_hub preset folder, with its tokenizer",
    )
    act(
        f,
        "Open model with custom objects…",
        window.open_model_with_custom_objects_dialog,
        None,
        "Open a model that uses custom layers, with the Python file that defines them",
    )
    act(f, "Open &input…", window.open_image_dialog, "Ctrl+I", "An image, arrays (.npy/.npz), a CSV row or token ids")
    act(f, "&Type tokens…", window.type_tokens_dialog, "Ctrl+T", "Token ids, or words with a vocabulary, as the input")
    act(f, "Open vocabulary…", window.open_vocabulary_dialog, None, "Show token ids as words (one token per line)")
    act(
        f,
        "Open training &log…",
        window.open_training_log_dialog,
        "Ctrl+Shift+L",
        "A GradientMonitor log folder: gradient flow over training steps, alerts, checkpoints",
    )
    window.recent_menu = f.addMenu("Recent models")
    f.addSeparator()
    act(f, "Open session…", window.open_session_dialog, "Ctrl+Alt+O", "Open a .gradscope.json session")
    act(
        f,
        "&Save session…",
        window.save_session_dialog,
        QKeySequence.StandardKey.Save,
        "Save model, image, plan, view",
    )
    f.addSeparator()
    act(f, "Export overlay PNG…", window.export_overlay_dialog, "Ctrl+E", "The overlay as PNG + JSON sidecar")
    act(f, "Export flow plot (PNG/SVG)…", window.export_flow_image_dialog, None, "The gradient-flow plot")
    act(f, "Export flow CSV…", window.export_flow_csv_dialog, None, "Per-node gradient statistics as CSV")
    act(f, "Export map only…", window.export_map_dialog, None, "The coloured map without the image (PNG)")
    act(f, "Export signal (.npy)…", window.export_signal_dialog, None, "The raw signal behind the map, as NumPy")
    act(f, "Export plan JSON…", window.export_plan_dialog, None, "The plan as JSON")
    act(f, "Export plan as Python…", window.export_snippet_dialog, None, "A training script that uses this plan")
    act(f, "Export training report (HTML)…", lambda: export_report(window, "training"), None, REPORT_TIP)
    act(f, "Export evaluation report (HTML)…", lambda: export_report(window, "evaluation"), None, REPORT_TIP)
    act(f, "Import plan JSON…", window.import_plan_dialog, None, "Replace the plan with one from a JSON file")
    act(f, "Load rule file…", window.inspector.rule_editor._load_file, None, "Import user rules from a Python file")
    act(
        f,
        "Load installed rule plugins…",
        window.load_rule_plugins_dialog,
        None,
        "Import the rules installed packages offer (shows them first)",
    )
    f.addSeparator()
    act(f, "&Quit", window.close, QKeySequence.StandardKey.Quit)

    e = bar.addMenu("&Edit")
    window.undo_action = act(e, "&Undo plan change", s.editor.undo, QKeySequence.StandardKey.Undo)
    window.redo_action = act(e, "&Redo plan change", s.editor.redo, "Ctrl+Shift+Z")
    act(e, "Clear plan", s.editor.clear, None, "Back to the true gradient everywhere")

    v = bar.addMenu("&View")
    act(v, "Fit graph", window.graph_view.fit_all, None, "F in the graph")
    act(v, "Zoom in", lambda: window.graph_view.zoom(1.25), None, "Ctrl+= in the graph")
    act(v, "Zoom out", lambda: window.graph_view.zoom(0.8), None, "Ctrl+- in the graph")
    act(v, "Find node…", window.graph_view.focus_search, QKeySequence.StandardKey.Find)
    window.lr_action = act(
        v, "Left-to-right layout", window._toggle_direction, "Ctrl+L", "Lay the graph out left to right"
    )
    window.lr_action.setCheckable(True)
    act(v, "Collapse groups", lambda: window.session.document.collapse_all(True))
    act(v, "Expand all groups", lambda: window.session.document.collapse_all(False))
    v.addSeparator()
    panels = window.overlay.panels_box
    for key, name in zip("123", ("input", "map", "overlay")):
        act(v, f"Show the {name}", panels.toggles[name].toggle, f"Ctrl+{key}", f"Show or hide the {name} panel")
    act(v, "Map in a window", window.overlay.open_map_window, "Ctrl+Shift+M", "The map in a window of its own")
    v.addSeparator()
    toggle = window.diagnostics_dock.toggleViewAction()
    toggle.setText("Diagnostics panel")
    v.addAction(toggle)
    toggle = window.training_dock.toggleViewAction()
    toggle.setText("Training view")
    v.addAction(toggle)
    toggle = window.evaluation_dock.toggleViewAction()
    toggle.setText("Evaluation view")
    v.addAction(toggle)
    toggle = window.patching_dock.toggleViewAction()
    toggle.setText("Patching view")
    v.addAction(toggle)

    r = bar.addMenu("&Run")
    act(r, "Re-run", s.run, "F5", "Run the backward pass again")
    act(r, "Cancel", s.cancel, "Esc", "Cancel the running work")
    r.addSeparator()
    act(r, "Run diagnostics", window.diagnose, "Ctrl+D", "Which trainable variables get no gradient, and why")
    act(
        r,
        "Sanity checks of this plan",
        s.sanity_checks,
        "Ctrl+K",
        "Conservation, model randomisation (Adebayo et al. 2018) and finite differences",
    )
    act(
        r,
        "Evaluate on a folder…",
        window.evaluation_dock.show,
        "Ctrl+Shift+E",
        "Pointing Game, deletion/insertion, MuFidelity of the methods and this plan over a folder of images",
    )
    act(
        r,
        "Patch against a corrupted input…",
        window.patching_dock.show,
        "Ctrl+Shift+P",
        "Activation and attribution patching (exact, AtP, AtP*): each component x position, clean vs corrupted",
    )

    h = bar.addMenu("&Help")
    act(h, "Keyboard shortcuts", window._show_shortcuts)
    act(h, "About gradscope", window._show_about)
    window._refresh_recent()
