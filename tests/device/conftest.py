"""Device-test fixtures (defined in device_fixtures, shared with tests/kernels_mutants)."""

from device_fixtures import cuda_device, device_goldens, emulated_cuda, emulation_backend

__all__ = ["cuda_device", "device_goldens", "emulated_cuda", "emulation_backend"]
