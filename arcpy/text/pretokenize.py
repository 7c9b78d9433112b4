"""llama.cpp's pre-tokenizers: how a BPE vocabulary's text is cut into words before merging.

A GGUF file names its pre-tokenizer (tokenizer.ggml.pre); llama.cpp maps the name to a list of
regular expressions and cuts the text by each in turn: every match, and every stretch between two
matches, becomes a piece that the next expression cuts again, on its own (a `tokenizers` Split,
"isolated", per expression). The expressions below are llama.cpp's, in the dialect of the
`tokenizers` library (Oniguruma), read the way llama.cpp runs them:

- an expression with a Unicode class (\\p{L}, \\p{N}, ...) runs on text where each character
  beyond ASCII stands for its category, and \\p{Lu}, \\p{Ll}, \\p{Lt}, \\p{Lm} and \\p{Lo} all stand
  for any letter: they are written \\p{L} here (_any_letter);
- an expression without one runs on the characters, every whitespace character beyond ASCII
  turned into a vertical tab first: its character ranges never match a space such as U+3000, so
  they exclude \\s here (`&&[^\\s]`);
- `$` is the end of the piece, written \\z (Oniguruma's `$` is the end of any line), and `\\d` is
  [0-9];
- the expressions llama.cpp runs by hand-written code (GPT-2's, Llama 3's, Qwen2's, Qwen3.5's)
  are the expressions that code implements.

One expression is the model's own instead: o200k's (gpt-4o's name and those llama.cpp reads as it,
gpt-oss's among them), as the models' tokenizer.json files have it. Read llama.cpp's way, every
letter beyond ASCII would be both upper and lower case and a combining mark no letter, which cuts
"ÉCOLE", "МоскваПривет" or a decomposed "été" otherwise than the models' own tokenizer does; llama.cpp
has no test cases for these names.

Characters assigned after llama.cpp's Unicode tables (which Oniguruma may know) can split
differently; every character of llama.cpp's own tokenizer test texts splits the same.

Names llama.cpp refuses, or reads with a tokenizer this module does not describe (kimi-k2's
merge-less vocabulary, whitespace, the add_sep embedding vocabularies), are refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

from arcpy.checks import quoted
from arcpy.errors import ModelFileError


@dataclass(frozen=True)
class PreTokenizer:
    """What a pre-tokenizer name stands for in llama.cpp.

    `splits` are applied in turn. `ignore_merges`: a word that is itself a token is that token.
    `add_bos`: a prompt starts with BOS where the file does not say; `bos_always` even where it
    says no. `byte_level`: GPT-2's bytes-as-characters; otherwise raw UTF-8 with spaces as U+2581
    and <0xNN> byte tokens (Gemma 4)."""

    splits: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False
    bos_always: bool = False
    byte_level: bool = True

    def pre_tokenizer(self) -> pre_tokenizers.PreTokenizer:
        """The `tokenizers` pre-tokenizer: the splits in turn, then (byte-level) bytes as characters."""
        steps = [pre_tokenizers.Split(Regex(rx), "isolated") for rx in self.splits]
        if self.byte_level:
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def _any_letter(rx: str) -> str:
    """\\p{Lu}, \\p{Ll}, \\p{Lt}, \\p{Lm}, \\p{Lo} as llama.cpp reads them: any letter."""
    return re.sub(r"\\p\{L[ultmo]\}", r"\\p{L}", rx)


_CONTRACTION = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (_CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = _CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_CONTRACTION + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_JAIS2 = (_CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          + "".join(r"|\s{%d}(?!\S)" % n for n in (512, 256, 128, 64, 32, 16, 8, 4)) + r"|\s{1,2}(?!\S)|\s{1}")
_DIGITS_BY_THREE = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"  # a run of digits in threes from its end
_HAN_KANA = r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+"
_HAN_HANGUL = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}&&[^\s]]+"
_ASCII_PUNCT_WORD = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"""
_DEEPSEEK3_WORDS = (_ASCII_PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_LLM_LETTERS = (
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}"
    r"\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}"
    r"\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}"
    r"\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}"
    r"\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}"
    r"\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}"
    r"\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}"
    r"\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}"
    r"\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}"
    r"\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}"
    r"\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}"
    r"\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}"
    r"\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+")
_DEEPSEEK_LLM_PUNCT = r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}&&[^\s]]+"
_BLOOM = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+"
_LEAD = r"[^\r\n\p{L}\p{N}]?"  # one character that is not a letter, a digit or a line break, or none
_UPPER_LOWER = r"((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"  # llama.cpp's reading of [Lu..]*[Ll..]+
_UPPER = r"((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"        # and of [Lu..]+[Ll..]*
_TEKKEN = (_LEAD + _UPPER_LOWER + "|" + _LEAD + _UPPER
           + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (_LEAD + _UPPER_LOWER + _CONTRACTION + "?|" + _LEAD + _UPPER + _CONTRACTION + "?"
          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GRANITE_MULTI = _GPT4O.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
_O200K_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_O200K = (_LEAD + r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _O200K_CONTRACTION + "|"
          + _LEAD + r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _O200K_CONTRACTION
          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CAPS, _SMALL = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CASED_WORDS = _any_letter(_LEAD + _CAPS + "*" + _SMALL + "+" + _CONTRACTION + "?|"
                           + _LEAD + _CAPS + "+" + _SMALL + "*" + _CONTRACTION + "?")
_NEWLINE_RUNS = r"[^\n]+|[\n]+"

_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_GPT2_PRE = PreTokenizer((_GPT2,))
_DIGITS_PRE = PreTokenizer((r"\p{N}", _GPT2))
_QWEN2_PRE = PreTokenizer((_QWEN2,))
_LLAMA3_SPLIT = PreTokenizer((_LLAMA3,))
_DEEPSEEK3 = PreTokenizer((r"\p{N}{1,3}", _HAN_KANA, _DEEPSEEK3_WORDS))
_BLOOM_PRE = PreTokenizer((_BLOOM,))
_GPT4O_PRE = PreTokenizer((_O200K,))
_TINY_AYA = PreTokenizer((_DIGITS_BY_THREE, _CASED_WORDS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
                                                         r"|\s+(?!\S)|\s+"))
_BAILING = PreTokenizer((r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",))
_GEMMA4 = PreTokenizer((_NEWLINE_RUNS,), add_bos=True, bos_always=True, byte_level=False)


def _names(pre: PreTokenizer, *names: str) -> dict[str, PreTokenizer]:
    return dict.fromkeys(names, pre)


# llama.cpp's names (src/llama-vocab.cpp), grouped as it groups them.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_names(_DEFAULT, "default"),
    **_names(_LLAMA3_PRE, "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
             "lfm2", "jina-v5-nano"),
    **_names(_LLAMA3_SPLIT, "dbrx", "smaug-bpe", "chatglm-bpe"),
    **_names(PreTokenizer((_LLAMA3,), ignore_merges=True), "glm4", "glm5"),
    **_names(PreTokenizer((_JAIS2,)), "jais-2"),
    **_names(PreTokenizer((r"[\r\n]", _DEEPSEEK_LLM_LETTERS, _DEEPSEEK_LLM_PUNCT, r"\s+\z", _HAN_HANGUL,
                           r"\p{N}+")), "deepseek-llm"),
    **_names(PreTokenizer((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _HAN_HANGUL, r"\p{N}")), "deepseek-coder"),
    **_names(_DEEPSEEK3, "deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"),
    **_names(PreTokenizer((r"\p{N}{1,3}", _HAN_KANA,
                           _ASCII_PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]"
                           r"|\s+(?!\S)|\s+", r"\p{N}")), "spark2_5"),
    **_names(PreTokenizer((
        r"[\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}"
        r"\x{FF1B}\x{FF0C}\x{3001}-\x{303F}\x{FE30}-\x{FE4F}]+|[\x{3105}-\x{312F}]+|" + _HAN_KANA,
        _CASED_WORDS + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"), ignore_merges=True), "youtu"),
    **_names(PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")), "falcon"),
    **_names(_DIGITS_PRE, "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
             "mellum2"),
    **_names(_GPT2_PRE, "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
             "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"),
    **_names(_QWEN2_PRE, "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
             "solar-open", "grok-2"),
    **_names(PreTokenizer((_QWEN35,)), "qwen35"),
    **_names(_BLOOM_PRE, "poro-chat", "bloom", "gpt3-finnish"),
    **_names(PreTokenizer((_BLOOM, r"\p{N}")), "viking"),
    **_names(PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True), "tekken"),
    **_names(PreTokenizer((r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )",
                           r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", _GPT2), add_bos=True), "chameleon"),
    **_names(_GPT4O_PRE, "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
    **_names(PreTokenizer((_GRANITE_MULTI,), ignore_merges=True), "granite-embed-multi-97m"),
    **_names(_TINY_AYA, "tiny_aya", "cohere2moe"),
    **_names(PreTokenizer((r"\p{N}+", r"(?=([0-9]{3})+(?![0-9]))")), "superbpe"),
    **_names(_BAILING, "bailingmoe", "bailingmoe2", "llada-moe"),
    **_names(PreTokenizer((_CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                           r"|\s+(?!\S)|\s+",)), "seed-coder"),
    **_names(PreTokenizer((r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)),
             "ufakzeka"),
    **_names(PreTokenizer((
        _DIGITS_BY_THREE,
        r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{8C48}-\x{FAFF}\x{3040}-\x{309F}\x{30A0}-\x{30FF}\x{FF65}-\x{FF9F}"
        r"\x{2F00}-\x{2FDF}\x{E40}-\x{E7F}\x{E80}-\x{EFF}\x{1780}-\x{17FF}\x{1000}-\x{109F}\x{AA60}-\x{AA7F}"
        r"\x{A9E0}-\x{A9FF}\x{AC00}-\x{D7AF}\x{1100}-\x{11FF}]+",
        _DEEPSEEK3_WORDS)), "afmoe"),
    **_names(PreTokenizer((_NEWLINE_RUNS, _QWEN2)), "laguna"),
    **_names(PreTokenizer((_CONTRACTION + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                           r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",)), "exaone-moe"),
    **_names(_GEMMA4, "gemma4", "granite-embed-multi-311m"),
    **_names(PreTokenizer((_NEWLINE_RUNS,), byte_level=False), "sarvam-moe"),
    **_names(PreTokenizer((r"\p{N}{1,3}", _CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                           r"|\s*[\r\n]+|\s+(?!\S)|\s+"), ignore_merges=True), "minicpm5"),
}


def pre_tokenizer_named(source: str, name: str) -> PreTokenizer:
    """The pre-tokenizer llama.cpp reads `name` as (an empty name is "default"); any other name is
    one ModelFileError line, as llama.cpp refuses it too: the words would be cut some other way."""
    pre = PRE_TOKENIZERS.get(name or "default")
    if pre is None:
        raise ModelFileError(f"{source}: unsupported pre-tokenizer {quoted(name)} (tokenizer.ggml.pre): "
                             "not one whose words arcpy can cut as llama.cpp does")
    return pre
