"""The hook a conftest.py implements to give the device items another backend than CUDA."""

from __future__ import annotations

import pytest


@pytest.hookspec(firstresult=True)
def pytest_csa_conform_backend(config: pytest.Config):
    """Return the backend the device items launch on, or None for the CUDA device.

    A backend has the interface of ``csa_conform.device.cuda.CudaBackend`` (info, function, launch,
    upload, empty, full, download). Called once per process, at the first device item; the
    project's own tests answer with the g++ host emulation of the kernels.
    """
