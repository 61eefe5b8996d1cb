"""Maps the top-level kernels/ and goldens/ci.h5 into the wheel's package at build time.

The design keeps both folders at the repository root; an installed package
must still find them through importlib.resources (csa_conform/_base/resources.py).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PACKAGE_DATA = {"kernels": ("block_quant.cuh", "*.cu"), "goldens": ("ci.h5",)}


class BuildWithPackageData(build_py):
    def run(self):
        super().run()
        root = Path(__file__).resolve().parent
        for folder, patterns in PACKAGE_DATA.items():
            target = Path(self.build_lib) / "csa_conform" / folder
            self.mkpath(str(target))
            for pattern in patterns:
                for source in sorted((root / folder).glob(pattern)):
                    self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildWithPackageData})
