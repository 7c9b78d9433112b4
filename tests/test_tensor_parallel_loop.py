"""Tensor parallelism, CPU tier: the device loop driven over several ranks (arcpy/parallel/devices.py)
against FakeDevices, and the split model on the NumPy backend through the engine."""

import pytest
from scripted_tokens import scripted_tokens

from arcpy.backends import open_engine
from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.scripted import scripted_next
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import ContextLostError, DeviceFaultError, InvalidArgumentError
from arcpy.loop import gate
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.settings import EngineSettings
from arcpy.parallel.devices import TensorParallelDevice
from arcpy.sampling import Sampling

PROMPT = [5, 9, 2]


def ranks(n, faults=None):
    """n fake ranks of one scripted model; `faults` maps a rank to its FakeScript's faults."""
    faults = faults or {}
    return TensorParallelDevice([FakeDevice(FakeScript(**faults.get(r, {}))) for r in range(n)])


def engine(dev, **kw):
    return Engine(dev, "fake", EngineSettings(device_loop=True, burst=4, **kw), environ={}, latch=gate.FallbackLatch())


def reference(n, prompt=PROMPT):
    return scripted_tokens(prompt, n, FakeScript().vocab)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_the_ranks_give_the_single_devices_tokens_without_a_host_wait(n):
    dev = ranks(n)
    eng = engine(dev)
    assert list(eng.generate(PROMPT, 20)) == reference(20)
    st = eng.stats
    assert st.path == DEVICE_LOOP and st.host_waits == 0
    for rank in dev.ranks:  # every rank ran every step
        assert rank.steps_enqueued == dev.ranks[0].steps_enqueued > 0


def test_a_seeded_sampled_request_gives_the_single_devices_tokens():
    s = Sampling(temperature=0.8, top_k=20, seed=11)
    one = list(engine(FakeDevice(FakeScript())).generate(PROMPT, 24, sampling=s))
    assert list(engine(ranks(2)).generate(PROMPT, 24, sampling=s)) == one


@pytest.mark.parametrize("faulty", [0, 1])
def test_a_fault_word_on_any_rank_falls_back_with_the_same_tokens(faulty):
    dev = ranks(2, {faulty: dict(fault_word_at=3)})
    eng = engine(dev)
    assert list(eng.generate(PROMPT, 12)) == reference(12)
    assert eng.stats.path == f"{DEVICE_LOOP}+{HOST}" and "token out of range" in eng.stats.fallback


def test_a_commit_lost_on_rank_1_falls_back_with_the_same_tokens():
    eng = engine(ranks(2, {1: dict(lost_steps=frozenset({2}))}))
    eng.max_spins = eng.driver.max_spins = 100_000
    eng.driver.query_every = 8
    assert list(eng.generate(PROMPT, 10)) == reference(10)
    assert "idle" in eng.stats.fallback


def test_a_rank_that_commits_another_token_stops_the_loop_before_that_token():
    base = FakeScript()
    vocab = base.vocab

    def odd(tok, pos):  # rank 1's model makes another token at position 9
        return (scripted_next(tok, pos, vocab) + (pos == 9)) % vocab

    dev = TensorParallelDevice([FakeDevice(FakeScript()), FakeDevice(FakeScript(next_token=odd))])
    eng = engine(dev)
    assert list(eng.generate(PROMPT, 12)) == reference(12)  # rank 0's, by the host path after the fault
    assert eng.stats.path == f"{DEVICE_LOOP}+{HOST}" and "the ranks disagree: rank 1" in eng.stats.fallback


def test_a_sticky_fault_on_rank_1_poisons_the_engine():
    eng = engine(ranks(2, {1: dict(sticky_fault_at=2)}))
    eng.driver.query_every = 8
    with pytest.raises(ContextLostError):
        list(eng.generate(PROMPT, 8))
    with pytest.raises(DeviceFaultError, match="unusable"):
        eng.start(PROMPT, 2)


def test_what_the_ranks_do_not_combine_is_not_offered():
    dev = ranks(2)
    caps = dev.capabilities
    assert caps.name == "2 x " + dev.ranks[0].capabilities.name + " (tensor parallel)"
    assert not (caps.logprobs or caps.logit_bias or caps.masks or caps.speculate_k or caps.prefix_row_bytes)
    eng = engine(dev)
    list(eng.generate(PROMPT, 4))
    assert eng.stats.speculation.startswith("off")
    with pytest.raises(InvalidArgumentError, match="log-probabilities: not over several devices yet"):
        dev.begin_sequence(SequenceStart(loop=True, logprobs=5))


def test_ranks_of_different_models_are_refused():
    with pytest.raises(InvalidArgumentError, match="rank 1 has vocab 32"):
        TensorParallelDevice([FakeDevice(FakeScript()), FakeDevice(FakeScript(vocab=32))])
    with pytest.raises(InvalidArgumentError, match="at least one device"):
        TensorParallelDevice([])


def test_the_stream_query_asks_every_rank():
    dev = ranks(2, {1: dict(sticky_fault_at=0)})
    dev.begin_burst(1, 4)
    dev.enqueue_step(1)
    with pytest.raises(ContextLostError):
        for _ in range(50):  # rank 1's sticky error surfaces through its stream, as a GPU's does
            dev.stream_query()


# --- the split model through the engine -----------------------------------------------------------

def test_the_numpy_backend_runs_the_split_model_with_the_single_models_tokens():
    from arcpy.model import synthetic_model

    model = synthetic_model("qwen3-tiny", seed=6)
    with open_engine(model, "numpy", max_seq=64, device_loop=False) as one, \
            open_engine(model, "numpy", max_seq=64, device_loop=False, devices=[0, 1]) as split:
        assert list(split.generate([4, 8, 15, 16], 10)) == list(one.generate([4, 8, 15, 16], 10))
        assert split.device.ref.world == 2


@pytest.mark.parametrize("devices, why", [
    ([], "devices must list 1 to 8"), ([0, 0], "distinct"), ([-1], "devices must list"), (list(range(9)), "1 to 8"),
    ("01", "devices must list"),
])
def test_bad_devices_are_refused_in_one_line(devices, why):
    from arcpy.model import synthetic_model

    with pytest.raises(InvalidArgumentError, match=why):
        open_engine(synthetic_model("qwen3-tiny"), "numpy", max_seq=16, devices=devices)


def test_the_gpu_split_needs_a_gpu_and_says_so_in_one_line():
    from arcpy import _lib
    from arcpy.errors import NoDeviceError
    from arcpy.model import synthetic_model

    if _lib.cuda_available()[0]:
        pytest.skip("a GPU is here: the GPU tier runs the split (tests/test_gpu_tensor_parallel.py)")
    with pytest.raises(NoDeviceError, match="no CUDA device"):
        open_engine(synthetic_model("qwen3-tiny"), "cuda", max_seq=16, devices=[0, 1])
    with pytest.raises(InvalidArgumentError, match="2 key/value heads do not divide among 4"):
        open_engine(synthetic_model("qwen3-tiny"), "cuda", max_seq=16, devices=[0, 1, 2, 3])


def test_the_command_line_splits_the_model_and_says_what_cannot_split():
    from click.testing import CliRunner

    from arcpy import decode

    args = ["--backend", "numpy", "--shape", "qwen3-tiny", "--prompt-ids", "1 2 3", "--max-new-tokens", "6"]
    one = CliRunner().invoke(decode.main, args)
    two = CliRunner().invoke(decode.main, [*args, "--tensor-parallel", "2"])
    assert one.exit_code == two.exit_code == 0
    tokens = [line for line in one.output.splitlines() if line[:1].isdigit()]
    assert tokens and tokens == [line for line in two.output.splitlines() if line[:1].isdigit()]
    four = CliRunner().invoke(decode.main, [*args, "--tensor-parallel", "4"])
    assert four.exit_code == 1 and "the model's 2 key/value heads do not divide among 4" in four.output
    assert "Traceback" not in four.output
