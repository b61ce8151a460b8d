"""A WordPiece vocabulary (BERT's `vocab.txt`) built from a split's texts, by frequency.

Words are split exactly as `wordpiece.WordPieceTokenizer` will split them (its own
`normalize`, BERT's BasicTokenizer: casing, accents, punctuation, CJK), so every piece counted
here is a piece the tokenizer can produce. The vocabulary holds, in this order:
1. BERT's special tokens: `[PAD]` (id 0, `pad_token_id`), `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`;
2. every character seen, as a word start and as a `##` continuation: any word the split holds
   tokenizes without `[UNK]`;
3. the most frequent whole words (at least `min_count` times), up to `word_share` of the rest;
4. the most frequent `##` suffixes (2 to 6 characters) of the words left out, weighted by
   those words' counts: the tails (`##ing`, `##ly`, `##ness`) that a rare word then ends in.

This is not WordPiece's own training (likelihood-ranked merges, as in `tokenizers`' trainer);
it is the same file format and the same greedy longest-match tokenization, and what a rare
word costs is at most one piece per character. Ties break by the piece itself, so the same
texts give the same vocabulary, byte for byte.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ampflow.errors import ConfigError

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONTINUATION = "##"
SUFFIX_LENGTHS = range(2, 7)
_BATCH = 4096


@dataclass(frozen=True)
class VocabularyConfig:
    """How large the vocabulary is and which words earn a token of their own."""

    size: int = 8000
    min_count: int = 2
    word_share: float = 0.85  # of what remains after the special tokens and the characters
    do_lower_case: bool = True

    def __post_init__(self):
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 16:
            raise ConfigError(f"size must be an integer >= 16. Received: size={self.size!r}")
        if not isinstance(self.min_count, int) or self.min_count < 1:
            raise ConfigError(f"min_count must be an integer >= 1. Received: "
                              f"min_count={self.min_count!r}")
        if not isinstance(self.word_share, int | float) or not 0 <= self.word_share <= 1:
            raise ConfigError(f"word_share must be in [0, 1]. Received: "
                              f"word_share={self.word_share!r}")


def normalized_words(texts: Sequence[str], do_lower_case: bool) -> Counter:
    """How often each word occurs after the tokenizer's own normalization."""
    import tensorflow as tf

    from ampflow.modeling.wordpiece import WordPieceTokenizer

    splitter = WordPieceTokenizer(SPECIAL, do_lower_case=do_lower_case, sequence_length=2)
    counts: Counter = Counter()
    for start in range(0, len(texts), _BATCH):
        normalized = splitter.normalize(tf.constant(list(texts[start:start + _BATCH])))
        for line in normalized.numpy():
            counts.update(line.decode("utf-8").split())
    return counts


def build_wordpiece_vocabulary(texts: Sequence[str],
                               config: VocabularyConfig = VocabularyConfig()) -> list[str]:
    """`config.size` tokens (fewer when the texts hold fewer), `[PAD]` first."""
    counts = normalized_words(texts, config.do_lower_case)
    characters = sorted({c for word in counts for c in word})
    vocabulary = [*SPECIAL, *characters, *(CONTINUATION + c for c in characters)]
    if len(vocabulary) > config.size:
        raise ConfigError(
            f"size must hold the special tokens and every character of the texts twice "
            f"(word start and ##continuation). Received: size={config.size}, needed "
            f"{len(vocabulary)}")
    room = config.size - len(vocabulary)
    frequent = [w for w, n in _ranked(counts) if n >= config.min_count and len(w) > 1]
    words = frequent[:int(room * config.word_share)]
    vocabulary += words
    left_out = Counter({w: n for w, n in counts.items() if w not in set(words)})
    taken = set(vocabulary)
    suffixes = [s for s, _ in _ranked(_suffixes(left_out)) if s not in taken]
    vocabulary += suffixes[:config.size - len(vocabulary)]
    return vocabulary


def _suffixes(counts: Counter) -> Counter:
    """`##` tails of 2–6 characters of the words, each weighted by its word's count."""
    tails: Counter = Counter()
    for word, n in counts.items():
        for length in SUFFIX_LENGTHS:
            if len(word) > length:
                tails[CONTINUATION + word[-length:]] += n
    return tails


def _ranked(counts: Counter) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))
