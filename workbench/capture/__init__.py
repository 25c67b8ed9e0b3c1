"""Capture format v1: writer, lazy reader, importers and the recorder."""

from workbench.capture.reader import Capture, VerifyReport, open_capture
from workbench.capture.writer import CaptureWriter

__all__ = ["Capture", "CaptureWriter", "VerifyReport", "open_capture"]
