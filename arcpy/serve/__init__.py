"""The OpenAI-compatible HTTP server: `arcpy serve`, `python -m arcpy.serve`.

    schema   the OpenAI request bodies -> an arcpy Request (every field used, neutral, or a 400)
    shape    answers in OpenAI's shapes: responses, server-sent-event chunks, usage
    worker   the engine's own thread and its bounded FIFO queue; the thread-safe hand-off of pieces
    metrics  the Prometheus metrics of GET /metrics
    app      the ASGI application (Starlette): routes, errors, streaming, cancel on disconnect
    command  the command line: flags, start-up, uvicorn, a clean stop on SIGINT/SIGTERM
"""
