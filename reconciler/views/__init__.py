"""Views of a fleet for people: ``observed/STATUS.md`` and the dashboard, both from committed facts alone.

Both read what rigsync committed (the observed/*.yaml documents, the run archive, the curves) plus desired/, never
the provider or a box, so they work on a clone without credentials and render the same bytes from the same files.
``facts`` turns those files into one view model; ``status_md`` and ``dashboard`` only lay it out. ``opstax`` is the
one function that splits the bill into the work wanted and the tax around it (status, STATUS.md, the dashboard and
the bench call it); ``timeline`` lays each box's billed life out as segments, drawn by ``svg``.
"""
