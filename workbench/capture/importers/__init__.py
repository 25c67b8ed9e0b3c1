"""Capture importers: turn other engines' dumps into workbench captures.

Built in: ``sglang`` (SGLang's dumper), ``flashinfer`` (FlashInfer's API logging) and ``folder`` (files named by a pattern). Third parties add importers through the ``workbench.importers``
entry-point group or :func:`register_importer`. See docs/capturing.md.
"""

from workbench.capture.importers.base import (
    ENTRY_POINT_GROUP, Importer, ImporterInfo, ImporterWarning, get_importer, import_capture, importers,
    register_importer,
)

__all__ = ["ENTRY_POINT_GROUP", "Importer", "ImporterInfo", "ImporterWarning", "get_importer",
           "import_capture", "importers", "register_importer"]
