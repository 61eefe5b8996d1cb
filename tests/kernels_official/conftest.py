"""Official-kernel fixtures: the device tests' golden file and host emulation (tests/device)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "device"))

from device_fixtures import cuda_device, device_goldens, emulated_cuda, emulation_backend  # noqa: E402

__all__ = ["cuda_device", "device_goldens", "emulated_cuda", "emulation_backend"]
