"""A word-level tokenizer for the embedded model, so text canaries can run on it without a download.

The embedded checkpoint has random weights and no tokenizer; its default runs stay token-id only
(`skip_tokenizer_init`). For canaries a tokenizer only has to turn text into ids below the
model's vocab and every generated id back into text: each of the 12288 ids gets one word
(special tokens, some English words, then made-up syllable words), split on whitespace. It lives
in its own directory beside the checkpoint, so the checkpoint, its model id and the pinned token
hash stay exactly what they were.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from b70bench import records
from b70bench.stack import model as modelmod

# Part of the directory name: a change to the word list below must not reuse an old directory.
TOKENIZER_VERSION = 1
SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: the embedded config's bos 1 and eos 2
ENGLISH = (
    "the of and to in is was for on that with as by at from it he she they we you this be are "
    "or an not have has had but which one all were there their what when who will more no if out "
    "so up said can about into than them its only other new some time could these two may first "
    "then do any like my now over such our man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three quick brown fox jumps lazy dog red blue green sun moon "
    "star water fire stone tree river city king queen house road light night morning cat bird"
).split()
_CONSONANTS, _VOWELS = "bdfghklmnprstvz", "aeiou"


def words(vocab_size: int) -> list[str]:
    """Word of every id, in id order; all distinct."""
    syllables = [c + v for c, v in itertools.product(_CONSONANTS, _VOWELS)]
    out, seen = [], set()
    generated = itertools.chain(
        syllables, ("".join(p) for n in (2, 3, 4) for p in itertools.product(syllables, repeat=n))
    )
    for w in itertools.chain(SPECIALS, ENGLISH, generated):
        if len(out) == vocab_size:
            break
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def build(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {w: i for i, w in enumerate(words(vocab_size))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIALS[0]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces, no continuation pieces here
    return tok


def write(path: Path, vocab_size: int, max_len: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    build(vocab_size).save(str(path / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": SPECIALS[0],
        "bos_token": SPECIALS[1],
        "eos_token": SPECIALS[2],
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def ensure(model_dir: Path, config: dict) -> Path:
    """Directory of the embedded model's tokenizer (beside its checkpoint), written on first use."""
    final = Path(model_dir).parent / f"{Path(model_dir).name}-tokenizer-v{TOKENIZER_VERSION}"
    return records.atomic_directory(
        final,
        "tokenizer_config.json",
        lambda tmp: write(tmp, config["vocab_size"], config.get("max_position_embeddings", 8192)),
    )


def directory(tokenizer: str | None, embedded: bool, model_path: str) -> str:
    """Where a server's or engine's tokenizer comes from: the one named (a local path made absolute), else the
    embedded model's word-level one, else the model's own directory or id."""
    if tokenizer:
        path = Path(tokenizer).expanduser()
        return str(path.resolve()) if path.exists() else tokenizer
    if embedded:
        return str(ensure(Path(model_path), modelmod.embedded_config()))
    return model_path
