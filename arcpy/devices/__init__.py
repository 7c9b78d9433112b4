"""The devices the loop runs on, each a DeviceOps (protocol.py: no synchronize in it).

    protocol    DeviceOps, Capabilities (and what a device admits), RingState, Counters, spin_until
    sequence    SequenceSpec (one request) and SequenceStart (what a device writes at its start)
    context     Context: one CUDA device and stream, device and pinned memory (libarc)
    cuda_model  CudaModel: libarc's forward of one model on a context
    cuda        CudaDevice and open_cuda_device: start-up on the GPU in one sequence
    scripted    the scripted stand-in forward, for the loop's GPU tests
    reference   ReferenceModel: the NumPy float32 forward, the oracle of the tests
    numpy_device  HostPathDevice, a host path whose work completes when enqueued; NumpyDevice, the
                  CPU backend over the reference
    fake        FakeDevice: a GPU in Python for the control logic's tests
"""
