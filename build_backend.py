"""The build backend: setuptools', with the CUDA 13.0 wheels (nvcc, the runtime, the CUTLASS
headers) as build requirements unless ARC_CUDA_ARCHS=none, whose CPU-only build compiles nothing
(setup.py) and so needs none of them. pyproject.toml names this module (backend-path)."""

import os

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403 - every hook is setuptools' but the two below

CUDA_WHEELS = [
    "nvidia-cuda-nvcc==13.0.*",
    "nvidia-cuda-runtime==13.0.*",
    "nvidia-cuda-crt==13.0.*",
    "nvidia-nvvm==13.0.*",
    "nvidia-cuda-cccl==13.0.*",
    "nvidia-cutlass==4.2.*",
]


def _cuda_wheels():
    return [] if os.environ.get("ARC_CUDA_ARCHS", "").strip().lower() == "none" else list(CUDA_WHEELS)


def get_requires_for_build_wheel(config_settings=None):
    return build_meta.get_requires_for_build_wheel(config_settings) + _cuda_wheels()


def get_requires_for_build_editable(config_settings=None):
    return build_meta.get_requires_for_build_editable(config_settings) + _cuda_wheels()
