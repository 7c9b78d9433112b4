"""`arcpy chat` (and `python -m arcpy.terminal_chat`): a conversation with a model in the terminal.

Each answer streams to stdout as it lands; notes go to stderr. The whole conversation goes through
the model's chat template every turn; when it no longer leaves room for an answer in the context,
the oldest turns are dropped (the system message stays) and a note says so.

    /reset    forget the conversation (the system message stays)
    /exit     end the session; so do Ctrl-D and Ctrl-C at the prompt
    /tool T   with --tools: T is the result of the model's next pending tool call; once every call
              has its result, the model answers on
    Ctrl-C    during an answer: stop that answer (what was shown stays in the conversation)

With --tools FILE (OpenAI's function tools, a JSON array) the tools go to the chat template; a
reasoning model's thinking and the model's tool calls are read from its answer (arcpy.text.answer)
and each call is shown on a line of its own, `[tool call NAME] ARGUMENTS`.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import click

from arcpy.errors import ArcError, InvalidArgumentError
from arcpy.files import read_json_file
from arcpy.front import check_backend, check_context, model_or_demo, one_line_errors, open_engine, open_model
from arcpy.loop.engine import Engine
from arcpy.loop.prompt import request_ids, room_hint
from arcpy.loop.request import Request, TemplateKwargs
from arcpy.options import (EngineOptions, ModelOptions, PrefillProgress, SamplingOptions, about, as_records,
                           check_model, engine_options, model_options, parse_template_kwargs, sampling_options,
                           template_options, with_options)
from arcpy.sampling import Sampling
from arcpy.text.answer import Splitter, split_options
from arcpy.text.tools import check_tools

PROMPT = ">>> "
HELP = ("/reset forgets the conversation, /exit ends it (so do Ctrl-D and Ctrl-C at the prompt); "
        "/tool RESULT answers the next tool call; Ctrl-C during an answer stops it")
DEFAULT_MAX_NEW = 512


@dataclass
class Reply:
    text: str
    stopped: bool            # Ctrl-C cut it
    dropped: int = 0         # earlier turns left out to fit the context
    summary: str = ""        # the engine's statistics


class Conversation:
    """The history of one chat and how each turn is asked of the engine (one with the model's text,
    `engine.text`)."""

    def __init__(self, engine: Engine, system: str | None = None, max_new_tokens: int = DEFAULT_MAX_NEW,
                 stop=(), sampling: Sampling | None = None, template_kwargs=None, tools=None,
                 model_context: int | None = None):
        self.engine, self.text, self.system = engine, engine.text, system  # the model's text: open_engine's
        # the model's own context, which --max-seq may raise the engine's to (default: the engine's)
        self.model_context = model_context or engine.device.max_seq
        self.max_new_tokens, self.stop, self.sampling = max_new_tokens, tuple(stop), sampling or Sampling()
        self.template_kwargs = TemplateKwargs(template_kwargs)  # checked once, for every turn
        self.tools = check_tools(tools) or None
        # (user, the answer's text), or with tools (user, [the assistant's and tools' messages])
        self.turns: list[tuple[str, str | list[dict]]] = []
        self.pending: list[dict] = []  # tool calls of the last answer still without a result

    def reset(self) -> None:
        self.turns.clear()
        self.pending.clear()

    def messages(self, user: str | None, turns) -> list[dict]:
        """The conversation for the template; `user` None continues the last turn (after tool results)."""
        out = [{"role": "system", "content": self.system}] if self.system is not None else []
        for asked, answered in turns:
            out.append({"role": "user", "content": asked})
            out += [{"role": "assistant", "content": answered}] if isinstance(answered, str) else answered
        return out + ([{"role": "user", "content": user}] if user is not None else [])

    def fit(self, user: str) -> tuple[list[int], int]:
        """The prompt's token ids for `user` after the history, and how many of the oldest turns
        were left out so that the answer has room: its budget, or a quarter of the context."""
        context = self.engine.device.max_seq
        room = min(self.max_new_tokens, context // 4)
        for dropped in range(len(self.turns) + (user is not None)):  # a turn being continued stays
            ids = request_ids(self.text, Request(messages=self.messages(user, self.turns[dropped:]),
                                                 template_kwargs=self.template_kwargs, tools=self.tools))
            if len(ids) + room <= context:
                return ids, dropped
        if len(ids) < context:
            return ids, len(self.turns) - (user is None)
        hint = room_hint(len(ids) + 1, context, self.model_context, smaller="shorten the message")
        raise InvalidArgumentError(f"the message takes {len(ids)} tokens with the template; the context holds "
                                   f"{context}: {hint}")

    def answer(self, user: str | None, write: Callable[[str], None], stop_asked: Callable[[], bool]) -> Reply:
        """Stream the answer to `user` through `write`; stop at the piece after `stop_asked()`.
        `user` None: the model answers on after the tools' results."""
        ids, dropped = self.fit(user)
        if dropped:
            del self.turns[:dropped]
        request = Request(prompt_ids=ids, max_new_tokens=self.max_new_tokens, stop=self.stop,
                          sampling=self.sampling)
        splitter = self._splitter(ids)
        shown, stopped = [], False
        try:
            with contextlib.closing(self.engine.stream(request)) as pieces:
                for piece in pieces:
                    for text in self._shown(splitter, piece):
                        write(text)
                        shown.append(text)
                    if stop_asked():
                        stopped = True
                        break
            for text in self._shown(splitter, None):
                write(text)
                shown.append(text)
        except KeyboardInterrupt:  # a second Ctrl-C, inside the engine
            self.engine.finish()
            stopped = True
        self._record(user, "".join(shown), splitter)
        st = self.engine.stats
        return Reply("".join(shown), stopped, dropped, st.summary() + f", finished: {st.finish_reason}")

    def tool_result(self, result: str, write: Callable[[str], None], stop_asked: Callable[[], bool]) -> Reply | None:
        """`result` answers the next pending call; once none is pending, the model answers on
        (its Reply), else None."""
        if not self.pending:
            raise InvalidArgumentError("no tool call is waiting for a result")
        call = self.pending.pop(0)
        self.turns[-1][1].append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                                  "content": result})
        return None if self.pending else self.answer(None, write, stop_asked)

    def _splitter(self, ids: list[int]) -> Splitter | None:
        """With tools, or for harmony's messages (which are never shown as written): the answer's
        splitter; else None."""
        options = split_options(self.text, ids, self.tools)
        if options is None or self.tools is None and not options["harmony"]:
            return None
        return Splitter(**options)

    @staticmethod
    def _shown(splitter: Splitter | None, piece) -> list[str]:
        """What to write for a piece (None: the end): its text, or with tools the text the splitter
        let through and each call on a line of its own."""
        if splitter is None:
            return [piece.text] if piece is not None and piece.text else []
        deltas = splitter.push(piece.text, piece.token) if piece is not None else splitter.finish()
        return [d.reasoning + d.content if d.tool_call is None else
                f"\n[tool call {d.tool_call['function']['name']}] {d.tool_call['function']['arguments']}\n"
                for d in deltas]

    def _record(self, user: str | None, shown: str, splitter: Splitter | None) -> None:
        if splitter is None:
            self.turns.append((user, shown))
            return
        a = splitter.answer
        message = {"role": "assistant", "content": a.content}
        if a.reasoning:  # the template keeps it where the model expects it (within a turn of calls)
            message["reasoning_content"] = a.reasoning
        if a.tool_calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in a.tool_calls]
        if user is None:
            self.turns[-1][1].append(message)
        else:
            self.turns.append((user, [message]))
        self.pending = list(message.get("tool_calls", ()))


class StopKey:
    """Ctrl-C during an answer: the first asks the answer to stop at its next piece, a second
    interrupts at once. Elsewhere Ctrl-C is Python's KeyboardInterrupt."""

    def __init__(self):
        self.asked = False

    def __call__(self) -> bool:
        return self.asked

    @contextlib.contextmanager
    def armed(self):
        self.asked = False
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(signum, frame):
            if self.asked:
                raise KeyboardInterrupt
            self.asked = True

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


def converse(conversation: Conversation, read: Callable[[str], str] = input, out=None, err=None,
             stop_key: StopKey | None = None, stats: bool = False) -> int:
    """The session: read a line, answer it, until /exit, Ctrl-D or Ctrl-C at the prompt. The exit
    status (0)."""
    out, err = out or sys.stdout, err or sys.stderr
    stop_key = stop_key or StopKey()

    def write(text: str) -> None:
        out.write(text)
        out.flush()

    while True:
        try:
            line = read(PROMPT)
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return 0
        command = line.strip()
        if not command:
            continue
        if command.startswith("/") and len(command.split()) == 1:
            if command in ("/exit", "/quit"):
                return 0
            if command == "/reset":
                conversation.reset()
                err.write("(the conversation is forgotten)\n")
            else:
                err.write(f"{HELP}\n" if command == "/help" else f"unknown command {command}: {HELP}\n")
            continue
        try:
            with stop_key.armed():
                if command.startswith("/tool "):
                    reply = conversation.tool_result(line.strip()[len("/tool"):].strip(), write, stop_key)
                    if reply is None:
                        err.write(f"({len(conversation.pending)} more tool call(s) wait for a result)\n")
                        continue
                else:
                    reply = conversation.answer(line, write, stop_key)
        except ArcError as exc:
            err.write(f"error: {exc}\n")
            continue
        out.write("\n")
        out.flush()
        if reply.dropped:
            err.write(f"(the {reply.dropped} oldest turn{'s' if reply.dropped > 1 else ''} left out to fit the "
                      "context)\n")
        if reply.stopped:
            err.write("[stopped]\n")
        if stats:
            err.write(f"({reply.summary})\n")


@click.command("chat", context_settings={"help_option_names": ["-h", "--help"]})
@with_options(model_options("A Hugging Face model directory or a .gguf file with a chat template",
                            "Default: the demo model."))
@click.option("--system", default=None, help="The system message.")
@with_options(template_options())
@click.option("-n", "--max-new-tokens", type=click.IntRange(min=1), default=DEFAULT_MAX_NEW, show_default=True,
              help="At most this many new tokens per answer.")
@click.option("--stop", "stop_strings", multiple=True, help="Also end an answer at this text (repeatable).")
@with_options(engine_options())
@with_options(sampling_options(helps={"seed": "Seed of the sampler (with --temperature): every answer drawn from it."}))
@click.option("--stats", is_flag=True, help="After each answer, its statistics on stderr.")
@click.option("--tools", "tools_path", type=click.Path(dir_okay=False), default=None,
              help="A JSON file of OpenAI function tools for the template; calls are shown, /tool answers them.")
@as_records
def main(**options):
    """Chat with a model in the terminal: the answer streams as it lands."""
    sys.exit(run(ChatOptions(**options)))


@dataclass(frozen=True)
class ChatOptions:
    """What the chat command's options say, one record (main builds it)."""

    model_opts: ModelOptions = ModelOptions()
    system: str | None = None
    template_kwargs: tuple = ()     # --template-kwarg KEY=VALUE, as typed
    max_new_tokens: int = DEFAULT_MAX_NEW
    stop_strings: tuple = ()
    stats: bool = False             # each answer's statistics on stderr
    tools_path: str | None = None   # a JSON file of OpenAI function tools
    engine_opts: EngineOptions = EngineOptions()
    sampling_opts: SamplingOptions = SamplingOptions()


def run(options: ChatOptions, read=input) -> int:
    """The session, start to end; the exit status. Mistakes are one line on stderr."""
    o = options
    with one_line_errors() as errors:
        sampling = o.sampling_opts.sampling()
        kwargs = parse_template_kwargs(o.template_kwargs)
        if any(not s for s in o.stop_strings):
            raise click.UsageError("--stop must not be empty")
        tools = None
        if o.tools_path is not None:
            with about("--tools"):
                tools = check_tools(read_json_file(Path(o.tools_path), "tools file"))
        check_backend(o.engine_opts)
        check_model(o.model_opts.model_path, o.model_opts.revision)
        model_path = model_or_demo(o.model_opts.model_path)
        model, text = open_model(model_path, revision=o.model_opts.revision)
        if text is None or text.chat_template is None:
            raise click.UsageError(f"{model.name} has no {'tokenizer' if text is None else 'chat template'}: "
                                   "arcpy chat needs both (arcpy generate takes a plain prompt)")
        check_context(model, o.engine_opts)
        with open_engine(model, text, o.engine_opts, prefill_progress=PrefillProgress()) as engine:
            if sys.stdin.isatty() and read is input:
                with contextlib.suppress(ImportError):
                    import readline  # noqa: F401 - line editing and history for input()
            click.echo(f"chat with {model.name} (backend {engine.backend}); {HELP}", err=True)
            conversation = Conversation(engine, o.system, o.max_new_tokens, o.stop_strings, sampling, kwargs, tools,
                                        model.config.max_seq)
            return converse(conversation, read, stats=o.stats)
    return errors.status


if __name__ == "__main__":
    main()
