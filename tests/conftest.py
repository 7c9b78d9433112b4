import pytest

import arcpy


def pytest_collection_modifyitems(config, items):
    """GPU-tier tests (marker `gpu`) skip, saying why, where there is no usable GPU."""
    if arcpy.cuda_available():
        return
    skip = pytest.mark.skip(reason=f"GPU tier: {arcpy.cuda_status()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
