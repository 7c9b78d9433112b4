"""What the fixture scripts share (qwen35_fixtures.py, gpt_oss_fixtures.py, gemma4_fixtures.py): a
greedy run of transformers' float32 model from a random prompt, and its logits."""

import numpy as np
import torch


def _logits_of(model, tokens: list[int]) -> np.ndarray:
    """The model's float32 logits at every position of `tokens`, without a cache."""
    with torch.no_grad():
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()


def greedy_run(model, seed: int, vocab: int, n_prompt: int, n_gen: int):
    """A prompt of n_prompt random ids (NumPy's generator of `seed`) and n_gen greedy tokens after
    it -> (tokens, the logits at every position, each position's top two logits, ascending)."""
    rng = np.random.default_rng(seed)
    tokens = [int(t) for t in rng.integers(0, vocab, n_prompt)]
    for _ in range(n_gen):
        tokens.append(int(_logits_of(model, tokens)[-1].argmax()))
    logits = _logits_of(model, tokens)
    return tokens, logits, np.sort(logits, axis=1)[:, -2:]
