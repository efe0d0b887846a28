"""Kernel tests run on CPU through Triton's interpreter when no GPU is visible.

The interpreter is chosen when kernels are defined, so the kernel modules are imported here
with `TRITON_INTERPRET=1` and the variable is restored at once: nothing else in the session
(training subprocesses of other packages) inherits it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

import torch

import primus.turbo.kernels

if not torch.cuda.is_available():
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        # Triton 3.9 loads gluon at the first launch, which only works under the interpreter.
        importlib.import_module("triton.experimental.gluon")
        importlib.import_module("primus.turbo.kernels._common")
        for info in pkgutil.iter_modules(primus.turbo.kernels.__path__):
            importlib.import_module(f"primus.turbo.kernels.{info.name}")
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
