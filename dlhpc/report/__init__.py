"""Reports: the status model now; HTML reports later."""
