"""The decode loop, above the devices: the burst driver, the gates and the fallback latch, the
engine and its request.

    burst    BurstDriver: enqueue a burst, watch the ring, catch faults without blocking
    gate     environment gates, device-loop admission, the fallback latch
    request  Request: what every front end asks the engine for
    plan     a SequenceSpec's plan: its checks, its path, its device start (no device call)
    settings EngineSettings: how an engine decodes, one frozen record
    engine   Engine: admit, prefill, generate; the device loop and the host path
"""
