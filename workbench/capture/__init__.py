"""Capture format v1: writer, lazy reader, importers and the recorder."""

from workbench.capture.reader import Capture, VerifyReport, open_capture


def __getattr__(name: str):
    if name == "CaptureWriter":  # imported on use: reading a capture needs no torch
        from workbench.capture.writer import CaptureWriter

        return CaptureWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["Capture", "CaptureWriter", "VerifyReport", "open_capture"]
