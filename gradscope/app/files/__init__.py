"""What the app writes and reads: the one export pipeline (picture + sidecar), the Session's exports through it,
and session files. May import app.rendering."""
