"""The host backend (``--backend host``): kernel modules built with g++ and run on the CPU.

What it emulates and what it cannot: specs/host-backend.md.
"""

from csa_conform.device.host.emulation import GXX, EmulatedArray, HostEmulationBackend, build_prelude

__all__ = ["GXX", "EmulatedArray", "HostEmulationBackend", "build_prelude"]
