"""Reports: the status model (:mod:`dlhpc.report.status`) and ``dlhpc report``'s
self-contained HTML pages (``_load`` builds the page data of ``_page_data`` from the DB
and the HDF5 curve archive of ``_curves``; ``_svg`` and ``_html`` render it; ``build``
writes the files)."""
