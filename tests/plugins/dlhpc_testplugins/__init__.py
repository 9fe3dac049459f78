"""A third-party plugin package that only the tests install (see ``tests/plugins/README.md``):
the searcher ``tpairs`` (:mod:`.searcher`) and the scheduler backend ``toy`` (:mod:`.backend`)."""
