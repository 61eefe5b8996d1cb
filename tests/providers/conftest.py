"""Provider-test fixtures: the CUDA probe of the device tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "device"))

from device_fixtures import cuda_device  # noqa: E402

__all__ = ["cuda_device"]
