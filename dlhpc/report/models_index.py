"""``models.html``: the models index page of an ``--all`` report folder.

:func:`write_models_index` reads every model version (read-only, like every
report) and publishes the page atomically next to the experiment pages it links
to (:func:`dlhpc.report._files.page_file`) and the ``index.html`` it links back to.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from dlhpc.report._files import INDEX_FILE, MODELS_FILE, ensure_folder, page_file, publish_file
from dlhpc.report._models_html import render_models
from dlhpc.store import Store
from dlhpc.store.model_registry import names, version_rows

__all__ = ["MODELS_FILE", "write_models_index"]


def write_models_index(store: Store, out_dir: Path, now: datetime | None = None) -> Path:
    """Write ``out_dir/models.html`` (every registered model, its versions, links to
    the experiment pages); returns its path. ``now`` (naive: UTC) stamps the page.
    Creates ``out_dir`` under the site's permission policy;
    :class:`~dlhpc.errors.DlhpcError` when it cannot be written."""
    with store.read() as s:
        models = names(version_rows(s))
    now = now or datetime.now(timezone.utc)
    stamp = (now if now.tzinfo else now.replace(tzinfo=timezone.utc)).timestamp()  # naive: UTC
    html = render_models(models, stamp, page_file, INDEX_FILE)
    ensure_folder(out_dir, store)
    path = out_dir / MODELS_FILE
    publish_file(path, html.encode("utf-8"))
    return path
