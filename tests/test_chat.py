"""`arcpy chat`: the conversation loop driven with scripted input (history, /reset, /exit, a stopped
answer, the oldest turns left out to fit the context), and the real program in a terminal (pty):
answers stream, Ctrl-C stops an answer and the session goes on, Ctrl-D ends it."""

from __future__ import annotations

import contextlib
import io
import re
import sys

import pytest
from serve_helpers import make_text_model, server_env

from arcpy.backends import open_engine
from arcpy.loading import load_checkpoint
from arcpy.terminal_chat import PROMPT, Conversation, converse

pexpect = pytest.importorskip("pexpect")  # the pty tests need it; a machine without it skips them


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_text_model(tmp_path_factory.mktemp("chat") / "tiny")


@pytest.fixture(scope="module")
def engine(model_dir):
    model, text = load_checkpoint(model_dir)
    with open_engine(model, "numpy", text=text) as e:
        yield e


def alone(engine, messages, n=6) -> str:
    return "".join(engine.chat(messages, max_new_tokens=n))


def script(*lines):
    """input() that answers with `lines`, then Ctrl-D."""
    it = iter(lines)

    def read(prompt):
        assert prompt == PROMPT
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return read


def test_each_turn_sees_the_history_and_reset_forgets_it(engine):
    conv = Conversation(engine, system="general", max_new_tokens=6)
    out, err = io.StringIO(), io.StringIO()
    assert converse(conv, script("hello there", "kenobi", "/reset", "kenobi", "/exit", "never read"), out, err) == 0
    sys_msg = {"role": "system", "content": "general"}
    first = alone(engine, [sys_msg, {"role": "user", "content": "hello there"}])
    second = alone(engine, [sys_msg, {"role": "user", "content": "hello there"},
                            {"role": "assistant", "content": first}, {"role": "user", "content": "kenobi"}])
    fresh = alone(engine, [sys_msg, {"role": "user", "content": "kenobi"}])
    assert out.getvalue().splitlines() == [first, second, fresh]
    assert second != fresh  # the history changed the answer, and /reset took it away
    assert "forgotten" in err.getvalue()
    assert conv.turns == [("kenobi", fresh)]


def test_ctrl_d_and_ctrl_c_at_the_prompt_end_the_session(engine):
    def interrupted(prompt):
        raise KeyboardInterrupt

    conv = Conversation(engine, max_new_tokens=4)
    assert converse(conv, script(), io.StringIO(), io.StringIO()) == 0
    assert converse(conv, interrupted, io.StringIO(), io.StringIO()) == 0


class StopAfter:
    """A Ctrl-C that arrives once `n` pieces were asked about."""

    def __init__(self, n):
        self.n, self.seen = n, 0

    def __call__(self):
        self.seen += 1
        return self.seen > self.n

    def armed(self):
        self.seen = 0
        return contextlib.nullcontext(self)


def test_a_stopped_answer_ends_at_once_stays_in_the_history_and_the_session_goes_on(engine):
    conv = Conversation(engine, max_new_tokens=40)
    out, err = io.StringIO(), io.StringIO()
    assert converse(conv, script("hello there", "general"), out, err, stop_key=StopAfter(3)) == 0
    assert err.getvalue().count("[stopped]") == 2
    assert engine.stats.finish_reason == "cancelled" and engine.stats.tokens <= 4
    full = alone(engine, [{"role": "user", "content": "hello there"}], 40)
    assert full.startswith(conv.turns[0][1]) and len(conv.turns[0][1]) < len(full)
    assert len(conv.turns) == 2


def test_unknown_commands_are_explained_and_empty_lines_ignored(engine):
    conv = Conversation(engine, max_new_tokens=2)
    out, err = io.StringIO(), io.StringIO()
    converse(conv, script("", "   ", "/wat", "/help"), out, err)
    assert "unknown command /wat" in err.getvalue() and "/reset forgets" in err.getvalue()
    assert conv.turns == []


def test_the_oldest_turns_are_left_out_when_the_context_is_full(model_dir):
    model, text = load_checkpoint(model_dir)
    with open_engine(model, "numpy", text=text, max_seq=40) as small:
        conv = Conversation(small, system="general", max_new_tokens=8)
        out, err = io.StringIO(), io.StringIO()
        long = " ".join(["hello"] * 12)
        converse(conv, script(long, long, long, long), out, err)
        assert "oldest turn" in err.getvalue() and "left out to fit the context" in err.getvalue()
        assert len(out.getvalue().split()) == 4 * 8  # every message was answered, 8 words each
        converse(conv, script(" ".join(["hello"] * 45)), out, err)
        assert "error: the message takes 46 tokens" in err.getvalue() and "context holds 40" in err.getvalue()


def test_a_message_too_long_for_the_context_gets_advice_that_can_help(model_dir):
    model, text = load_checkpoint(model_dir)
    own = model.config.max_seq  # 512
    with open_engine(model, "numpy", text=text, max_seq=40) as small:
        for words, hint in [(45, f"raise --max-seq (the model allows up to {own})"),
                            (own + 10, f"shorten the message (the model's own context is {own} positions)")]:
            conv = Conversation(small, system="general", max_new_tokens=8, model_context=own)
            out, err = io.StringIO(), io.StringIO()
            converse(conv, script(" ".join(["hello"] * words)), out, err)
            assert f"error: the message takes {words + 1} tokens with the template; the context holds 40: {hint}\n" \
                in err.getvalue(), err.getvalue()


def spawn(*args, timeout=120):
    return pexpect.spawn(sys.executable, ["-m", "arcpy.terminal_chat", "--backend", "numpy", *args], env=server_env(),
                         encoding="utf-8", timeout=timeout)


def test_in_a_terminal_answers_stream_and_ctrl_d_ends_the_session(model_dir, engine):
    child = spawn("--model", str(model_dir), "-n", "6")
    child.expect_exact(PROMPT)
    child.sendline("hello there")
    child.expect_exact(alone(engine, [{"role": "user", "content": "hello there"}]))
    child.expect_exact(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_in_a_terminal_ctrl_c_stops_the_answer_not_the_session(tmp_path):
    slow = make_text_model(tmp_path / "slow", shape="stories15M")  # about 12 ms a token here
    child = spawn("--model", str(slow), "-n", "1000")
    child.expect_exact(PROMPT)
    child.sendline("hello there")
    child.expect(r"\w+ \w+ \w+")  # the answer is streaming
    child.sendintr()
    child.expect_exact("[stopped]", timeout=10)
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_each_turn_reuses_the_rows_of_the_history_before_it(model_dir):
    model, text = load_checkpoint(model_dir)
    with open_engine(model, "numpy", text=text) as eng, open_engine(model, "numpy", text=text,
                                                                      prefix_cache=False) as cold:
        long = " ".join(f"w{i % 50}" for i in range(150))  # more than two chunks of the NumPy prefill
        conv = Conversation(eng, system=long, max_new_tokens=6)
        out, err = io.StringIO(), io.StringIO()
        converse(conv, script("hello there", "kenobi", "general"), out, err, stats=True)
        cached = [int(m.group(1)) for m in re.finditer(r"(\d+) of \d+ prompt tokens cached", err.getvalue())]
        assert len(cached) == 2 and all(c >= 128 for c in cached)  # the second and third turns
        history, want = [], []
        for user in ("hello there", "kenobi", "general"):
            history.append({"role": "user", "content": user})
            want.append("".join(cold.chat([{"role": "system", "content": long}, *history], max_new_tokens=6)))
            history.append({"role": "assistant", "content": want[-1]})
        assert out.getvalue().splitlines()[:3] == want  # as a cold engine answers each turn
