"""Capture importers: turn other engines' dumps into workbench captures.

Built in: ``sglang`` (SGLang's dumper and forward-hook dump), ``flashinfer`` (FlashInfer's API
logging), ``vllm-hidden-states`` (vLLM's hidden-states connector) and ``folder`` (files named by a
pattern). Third parties add importers through the ``workbench.importers``
entry-point group or :func:`register_importer`. See docs/capturing.md.
"""

from workbench.capture.importers.base import (
    ENTRY_POINT_GROUP, Importer, ImporterInfo, ImporterWarning, get_importer, import_capture, importers,
    register_importer,
)

__all__ = ["ENTRY_POINT_GROUP", "Importer", "ImporterInfo", "ImporterWarning", "get_importer",
           "import_capture", "importers", "register_importer"]
