"""The evented models a Session composes (one file each, each with its own events, no Qt): document, inputs,
plan editing and history, targeting, viewing, selection, results, comparison, reports, rule catalog, training
watch, evaluations, jobs and feedback. They call the pipelines (app.rendering, app.files, app.evaluation,
app.work), never the Session, and never the export pipeline's internals (``app.files.exports``)."""
