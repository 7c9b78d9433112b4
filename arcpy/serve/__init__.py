"""The OpenAI-compatible HTTP server: `arcpy serve`, `python -m arcpy.serve`.

    schema   the OpenAI request bodies -> an arcpy Request (every field used, neutral, or a 400)
    shape    answers in OpenAI's shapes: responses, server-sent-event chunks, usage
    worker   the engine's own thread and its bounded FIFO queue; the thread-safe hand-off of pieces
    metrics  the Prometheus metrics of GET /metrics
    app      the ASGI application (Starlette) and the service its routes share: requests to jobs
    routes   the routes, each a function of the request; errors in OpenAI's shape
    response one job's answer, whole or streamed; cancel on disconnect
    responses /v1/responses read as a chat completion; the store of earlier responses
    events   /v1/responses' answers: the response object and its streamed events
    tokens   /tokenize and /detokenize
    page.html the chat page at GET /
    command  the command line: flags, start-up, uvicorn, a clean stop on SIGINT/SIGTERM
"""
