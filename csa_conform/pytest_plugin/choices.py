"""The choices of the plugin's device options, spelled here so that declaring them imports nothing.

tests/plugin checks them against csa_conform.device.plan.Mode and csa_conform.device.backend.
"""

MODES = ("chained", "isolated")
BUILDS = ("strict", "production")
BACKENDS = ("cuda", "host")
DEFAULT_MODE = "chained"
DEFAULT_BUILD = "strict"
DEFAULT_BACKEND = "cuda"
