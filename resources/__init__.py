"""gradscope's own files (demo model and images, icons, example rules), installed as ``gradscope.resources``.

Nothing here is imported as code: the ``.py`` files below are examples the user opens (rule files) or scripts
that rebuild a bundled model. Find files with ``gradscope.core.resources.resource_path``."""
