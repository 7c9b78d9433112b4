"""What ends an answer besides the model's own end-of-sequence ids: the tokens that end a turn in
a family whose files may leave them out of their EOS ids, found by their text in the vocabulary."""

from __future__ import annotations

from arcpy.text import gemma4, harmony

# (the tokens that make a vocabulary the family's, the tokens of them that end an answer)
_FAMILIES = (
    ((harmony.CHANNEL, harmony.MESSAGE, *harmony.TURN_ENDS), harmony.TURN_ENDS),                # gpt-oss
    ((gemma4.CALL_OPEN, gemma4.RESPONSE, gemma4.TURN_END), (gemma4.TURN_END, gemma4.RESPONSE)),  # Gemma 4
)


def turn_end_ids(tokenizer) -> tuple[int, ...]:
    """The ids of the tokens that end a turn in the tokenizer's family (harmony's <|return|> and
    <|call|>, Gemma 4's <turn|> and <|tool_response>), where its vocabulary has them as added
    tokens; else none."""
    added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    out = []
    for marks, ends in _FAMILIES:
        if all(tag in added for tag in marks):
            out += [added[tag] for tag in ends]
    return tuple(out)
