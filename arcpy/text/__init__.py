"""Text around the engine: the tokenizer, streaming detokenization, chat templates, stop strings.

Nothing here is in the per-step path: the engine decodes token ids; this package turns text into
ids before a sequence and ids back into text as they land.

    spec      TextSpec: the tokenizer, BOS/EOS ids, add_bos, the chat template
    loader    load_text_spec: a Hugging Face model directory's text files -> TextSpec
    codec     encode, decode, StreamDecoder (ids -> text as they land)
    chat      render_chat: messages -> prompt text through the sandboxed template
    stops     StopStrings, TextStream (StreamDecoder then StopStrings), FinishReason (the engine's)
"""

from .chat import render_chat
from .codec import StreamDecoder, decode, encode
from .loader import load_text_spec
from .spec import TextSpec
from .stops import FinishReason, StopStrings, TextStream

__all__ = ["FinishReason", "StopStrings", "StreamDecoder", "TextSpec", "TextStream", "decode", "encode",
           "load_text_spec", "render_chat"]
