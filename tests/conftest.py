import pytest
from gpu_buffers import Gpu

import arcpy
from arcpy.devices.context import Context
from arcpy.loop import gate


def pytest_collection_modifyitems(config, items):
    """GPU-tier tests (marker `gpu`) skip, saying why, where there is no usable GPU."""
    if arcpy.cuda_available():
        return
    skip = pytest.mark.skip(reason=f"GPU tier: {arcpy.cuda_status()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def gpu_context():
    """One context per test module for the kernel tests (`gpu`)."""
    g = Gpu()
    yield g
    g.close()


@pytest.fixture(scope="module")
def ctx():
    """One arcpy Context per test module for the loop's tests (`gpu`)."""
    c = Context(0)
    yield c
    c.close()


@pytest.fixture
def gpu(gpu_context):
    """The module's context; what the test allocated is freed after it."""
    yield gpu_context
    gpu_context.free_all()


@pytest.fixture
def latch():
    """A fallback latch of the test's own, shared by the engines it builds."""
    return gate.FallbackLatch()
