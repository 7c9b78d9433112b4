"""What a generation reports: why it finished, and its statistics."""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEVICE_LOOP = "device-loop"
HOST = "host"


class FinishReason(str, enum.Enum):
    """Why a generation ended. GenerationStats.finish_reason holds one of these, or "cancelled",
    "preempted" or "fault" for a sequence cut short."""

    STOP_ID = "stop_id"            # the model produced one of the stop ids (EOS, end of turn)
    STOP_STRING = "stop_string"    # the text reached one of the stop strings (the caller's check)
    TOKEN_BUDGET = "token_budget"  # the requested number of new tokens was produced
    CONTEXT_FULL = "context_full"  # the sequence filled the context (max_seq positions)

    def __str__(self) -> str:
        return self.value


STOP_ID, TOKEN_BUDGET, CONTEXT_FULL = FinishReason.STOP_ID, FinishReason.TOKEN_BUDGET, FinishReason.CONTEXT_FULL


@dataclass
class GenerationStats:
    backend: str
    path: str
    prompt_tokens: int = 0
    tokens: int = 0
    seconds: float = 0.0
    graph_launches: int = 0
    cuda_calls: int = 0
    host_waits: int = 0     # waits for the stream to go idle while producing tokens
    setup_waits: int = 0    # waits at sequence start (the ring reset needs an idle stream)
    fallback: str | None = None
    finish_reason: str = ""
    seed: int | None = None  # a sampled sequence's seed (drawn when none was given): it reproduces it
    prefill: bool = False    # the prompt went through the model in one forward
    stop_id: int | None = None  # the stop id that ended it (finish_reason stop_id); never handed out
    speculation: str = "off"  # "on", or "off" with the reason
    drafts: int = 0           # drafts a speculative step verifies (k)
    spec_steps: int = 0       # speculative steps enqueued
    spec_tokens: int = 0      # tokens those bursts produced
    weight_reads: int = 0     # forwards that read the weights to produce tokens (a prefill counts one)
    cached_tokens: int = 0    # prompt tokens whose KV rows an earlier prefill left (not prefilled again)

    @property
    def tokens_per_step(self) -> float:
        """Tokens a speculative step produced, on average (1 to drafts + 1)."""
        return self.spec_tokens / self.spec_steps if self.spec_steps else 0.0

    @property
    def acceptance(self) -> float:
        """The share of draft slots accepted: (tokens - steps) / (steps * drafts)."""
        slots = self.spec_steps * self.drafts
        return (self.spec_tokens - self.spec_steps) / slots if slots else 0.0

    @property
    def tokens_per_weight_read(self) -> float:
        return self.tokens / self.weight_reads if self.weight_reads else 0.0

    def per_token(self, value: int) -> float:
        return value / self.tokens if self.tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        return (f"{self.tokens} tokens in {self.seconds:.3f} s ({self.tokens_per_second:.1f} tok/s), "
                f"path {self.path}, backend {self.backend}; per token: "
                f"{self.per_token(self.graph_launches):.2f} graph launches, "
                f"{self.per_token(self.cuda_calls):.2f} CUDA calls, "
                f"{self.per_token(self.host_waits):.2f} host waits"
                + (f"; speculation: {self.spec_steps} steps, {self.tokens_per_step:.2f} tokens a step, "
                   f"{self.acceptance:.0%} of drafts accepted, {self.tokens_per_weight_read:.2f} tokens a "
                   f"weight read" if self.spec_steps else "")
                + (f"; speculation {self.speculation}" if self.speculation.startswith("off:") else "")
                + (f"; {self.cached_tokens} of {self.prompt_tokens} prompt tokens cached" if self.cached_tokens
                   else ""))


@dataclass
class CacheStats:
    """The prefix reuse of an engine's prefills, across its sequences."""

    prefills: int = 0        # prompts prefilled
    hits: int = 0            # of them, prompts that reused rows
    prompt_tokens: int = 0
    cached_tokens: int = 0   # prompt tokens not prefilled again
    restored: int = 0        # hits whose rows came back from the store of earlier prefixes
    stored: int = 0          # prefixes copied into the store
    evicted: int = 0         # stored prefixes dropped to make room (least recently used first)

    def count(self, prompt_tokens: int, cached: int, restored: bool = False) -> None:
        self.prefills += 1
        self.hits += cached > 0
        self.restored += restored
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached

    @property
    def hit_rate(self) -> float:
        """The share of prompt tokens whose rows were reused."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
