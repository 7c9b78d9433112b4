"""Measurement on the GPU (scripts/bench.py runs it): tokens per second by path and shape, each
kernel of the step alone, and Hugging Face `generate` on the same shapes.

    loop              the device loop against the host path, the bandwidth floor, the regression guard
    kernels           the step's kernels one by one, replayed in graphs
    hf                transformers on the same shapes, where torch imports
    http_client       the server from outside: `arcpy serve` in a child process, a client that
                      stamps each streamed piece (scripts/server_overhead.py, scripts/load_test.py)
    serving_features  what the prefix cache, log-probabilities and structured output cost and save
"""
