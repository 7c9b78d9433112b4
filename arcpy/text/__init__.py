"""Text around the engine: the tokenizer, streaming detokenization, chat templates, stop strings.

Nothing here is in the per-step path: the engine decodes token ids; this package turns text into
ids before a sequence and ids back into text as they land.

    spec      TextSpec: the tokenizer, BOS/EOS ids, add_bos, the chat template
    loader    load_text_spec: a Hugging Face model directory's text files -> TextSpec
    gguf      gguf_text_spec: a GGUF file's Vocabulary (arcpy.vocabulary) -> TextSpec
    pretokenize  llama.cpp's pre-tokenizers by name: how a BPE vocabulary's text is cut into words
    codec     encode, decode, StreamDecoder (ids -> text as they land)
    specials  special-token strings in a user's text are encoded as text
    chat      chat_ids, render_chat: messages (and template keyword arguments) -> prompt ids or text
    sandbox   the bounded jinja2 sandbox templates run in (limits: its deadline and budget)
    stops     StopStrings, TextStream (StreamDecoder then StopStrings)
"""

from arcpy.text.chat import chat_ids, check_template_kwargs, render_chat
from arcpy.text.codec import StreamDecoder, decode, encode, token_text
from arcpy.text.gguf import gguf_text_spec
from arcpy.text.loader import load_text_spec
from arcpy.text.spec import TextSpec
from arcpy.text.stops import StopStrings, TextStream

__all__ = ["StopStrings", "StreamDecoder", "TextSpec", "TextStream", "chat_ids", "check_template_kwargs", "decode",
           "encode", "gguf_text_spec", "load_text_spec", "render_chat", "token_text"]
