"""Results shown in notebooks and HTML reports (``_repr_html_``, ``show()``, ``gradscope report``)."""
