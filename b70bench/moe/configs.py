"""Tilings of the u4 MoE down projection's Triton kernels: `Config`, its label, and its other written forms.

A label is a tiling's display id, e.g. m1n32k512s1w4st1sum-packed-paired-pf-pdl-early: block_m, block_n,
block_k, split_k, warps and stages, the reduction (sum: a second kernel; fused: in-kernel), then the flags that
are set, in a fixed order. Labels are written and parsed by walking one table, LABEL_TOKENS, so the two cannot
drift. A mixed tiling is its 2-pair and 1-pair labels joined by "+". The same tiling can also be written by
field name: `key=value,key=value`, or the JSON object a sweep stores (dataclasses.asdict).

Decode options (1-2 pairs per block): `packed` (16x2 dequant and products per word, _word_dot), `paired`
(nibbles reordered once per weight set so each activation pair is one 32-bit load), `tiled` (weights
N-tile-major), `maxnreg`, K-blocks deeper than the split (masked), `prefetch` (the next K-block's words in
registers), and on Hopper+ programmatic dependent launch: `pdl` (the sum kernel launched under the main
kernel, letting what follows launch before it waits), `early` (the main kernel launched under the previous
one, its weights streamed before it waits), and `dequant_early` (-dq: the first K-block also dequantized before
that wait, only its products after it), and `two_rows` (-2r: two word rows of one scale group share each 16x2
sum, halves-sum, scale and accumulation), and `programs_per_sm` (-oN: a shared-memory pad so that at most N
programs share an SM). A mixed tiling (`odd_pairs`) puts only an expert's pairs of pairs in 2-pair blocks and
the odd pairs in a second launch with a 1-pair tiling, the two running at the same time. What each bought on the H200:
docs/moe-down.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Config:
    """One tiling. block_m 0 means: pick from the mean pairs per hit expert."""

    block_m: int = 0
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    fused_reduce: bool = False
    packed: bool = False  # decode blocks: 16x2 packed dequant and products (_word_dot) instead of fp32 planes
    tiled: bool = False  # decode blocks: weights repacked N-tile-major once per weight set (tile_weights)
    maxnreg: int = 0  # registers per thread ptxas may use (0: its choice); fewer = more programs resident
    # decode blocks, CUDA: at most this many programs per SM (0: no cap), by shared memory each program holds
    # (-oN, residency_pad). Where the registers leave more slots than a one-wave grid needs, the next call's
    # programs (launched early under PDL) fill them unevenly as this call's leave (docs/moe-down.md).
    # The cap takes the L1 cache's share of the SM's memory, which 16-wide 2-warp tiles need.
    programs_per_sm: int = 0
    paired: bool = False  # packed decode: nibbles reordered (pair_nibbles) so x pairs are single 32-bit loads
    prefetch: bool = False  # decode blocks: the next K-block's words loaded before this block's products
    # Decode blocks, CUDA sm_90+ (programmatic dependent launch; the interpreter runs the kernels without it):
    # pdl: what follows the main kernel launches under it: the sum kernel (sum), or the next kernel
    # if that one is launched for it (fused)
    pdl: bool = False
    early: bool = False  # the main kernel launches under the previous kernel, streaming weights before it waits
    # -dq (packed, paired): the first K-block also dequantized before the wait, only its products after it
    dequant_early: bool = False
    # -2r (packed, paired, K-blocks of whole scale groups): two word rows of one group share each 16-bit sum
    two_rows: bool = False
    # A mixed tiling (block_m 2 decode): only an expert's pairs of pairs form 2-pair blocks; the odd pairs go
    # to a second launch with this 1-pair tiling, so no block carries a padded pair's products (mixed_blocks).
    # Label: the two labels joined by "+".
    odd_pairs: Config | None = None

    def label(self) -> str:
        own = "".join(_write(self, name, token) for name, token in LABEL_TOKENS)
        return own + (f"{MIXED}{self.odd_pairs.label()}" if self.odd_pairs else "")


# (Config field, its token), in label order. A token without a leading "-" is always written: an int as the
# token and its value (m1), the reduction as one of its two words (false, true). A "-" flag only when set: a
# bool as the token alone (-pf), an int as the token and its value (-r96).
LABEL_TOKENS = (
    ("block_m", "m"),
    ("block_n", "n"),
    ("block_k", "k"),
    ("split_k", "s"),
    ("num_warps", "w"),
    ("num_stages", "st"),
    ("fused_reduce", ("sum", "fused")),
    ("packed", "-packed"),
    ("paired", "-paired"),
    ("tiled", "-tiled"),
    ("maxnreg", "-r"),
    ("programs_per_sm", "-o"),
    ("prefetch", "-pf"),
    ("pdl", "-pdl"),
    ("early", "-early"),
    ("dequant_early", "-dq"),
    ("two_rows", "-2r"),
)
MIXED = "+"  # joins a mixed tiling's 2-pair and 1-pair labels
FIELDS = tuple(f.name for f in fields(Config))
FORMER_NAMES = {"singles": "odd_pairs", "per_sm": "programs_per_sm"}  # as sweep files written before carry them
_DEFAULT = Config()
_NUMBER = re.compile(r"\d+")


def _is_bool(name: str) -> bool:
    return isinstance(getattr(_DEFAULT, name), bool)


def _write(cfg: Config, name: str, token) -> str:
    value = getattr(cfg, name)
    if isinstance(token, tuple):
        return token[bool(value)]
    if not token.startswith("-"):
        return f"{token}{value}"
    if not value:
        return ""
    return token if _is_bool(name) else f"{token}{value}"


def flag_order() -> str:
    """The flags as a label orders them, e.g. "-packed -paired -tiled -rN ..." (for help and errors)."""
    return " ".join(
        token + ("" if _is_bool(name) else "N")
        for name, token in LABEL_TOKENS
        if isinstance(token, str) and token.startswith("-")
    )


def parse_label(label: str) -> Config:
    """Config from its label, e.g. m1n64k128s4w4st3sum (older sweep files carry only this); a mixed
    tiling is its 2-pair and 1-pair labels joined by "+"."""
    if label.count(MIXED) == 1:
        pairs, odd_pairs = label.split(MIXED)
        return replace(parse_label(pairs), odd_pairs=parse_label(odd_pairs))
    values, pos = {}, 0
    for name, token in LABEL_TOKENS:
        if isinstance(token, tuple):
            word = next((w for w in token if label.startswith(w, pos)), None)
            if word is None:
                raise ValueError(f"not a tiling label: {label!r}")
            values[name], pos = word == token[1], pos + len(word)
            continue
        flag = token.startswith("-")
        end = pos + len(token)
        if not label.startswith(token, pos):
            if flag:
                continue  # a flag that is not set
            raise ValueError(f"not a tiling label: {label!r}")
        if _is_bool(name):
            if end < len(label) and label[end] != "-":
                continue  # another flag that starts alike; what is left over fails below
            values[name], pos = True, end
            continue
        number = _NUMBER.match(label, end)
        if number is None:
            if flag:
                continue
            raise ValueError(f"not a tiling label: {label!r}")
        values[name], pos = int(number.group()), number.end()
    if pos != len(label):
        raise ValueError(f"not a tiling label: {label!r}")
    return Config(**values)


def from_fields(values: dict) -> Config:
    """Config from field names and values: the JSON object a sweep stores for a tiling (its `tiling`), or
    parse_fields' pairs. Values may be text ("1", "true"); `odd_pairs` a nested object or a label. Fields left
    out keep their defaults; FORMER_NAMES are read as the fields they became."""
    if not isinstance(values, dict):
        raise ValueError(f"a tiling by field names is an object of them, not {type(values).__name__}")
    values = {FORMER_NAMES.get(k, k): v for k, v in values.items()}
    unknown = [k for k in values if k not in FIELDS]
    if unknown:
        raise ValueError(f"unknown tiling key(s) {', '.join(map(str, unknown))}; the keys are {', '.join(FIELDS)}")
    return Config(**{k: _value(k, v) for k, v in values.items()})


def parse_fields(text: str) -> Config:
    """Config from `key=value,key=value` (Config's field names)."""
    values = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{item!r} is not key=value; the keys are {', '.join(FIELDS)}")
        values[key.strip()] = value.strip()
    return from_fields(values)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _value(name: str, value):
    if name == "odd_pairs":
        if value is None or isinstance(value, Config):
            return value
        if isinstance(value, dict):
            return from_fields(value)
        if isinstance(value, str):
            return None if value.lower() in ("", "none", "null") else parse_label(value)
        raise ValueError(f"tiling key odd_pairs: {value!r} is not a tiling (an object or a label)")
    if _is_bool(name):
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ValueError(f"tiling key {name}: {value!r} is not a bool (true/false, 1/0)")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise ValueError(f"tiling key {name}: {value!r} is not a whole number")


def load_tuned(path) -> dict:
    """(K, N, tokens) -> the fastest correct Config of a sweep's JSON (`--tune --json FILE`)."""
    from b70bench.errors import UsageError

    try:
        with open(path) as f:
            rows = json.load(f)["records"]
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"cannot read tuned tilings from {path}: {err}; write them with --tune --json FILE") from None
    best = {}
    for r in rows:
        if not r.get("ok") or r.get("time_us") is None:
            continue
        key = (r.get("k") or shape_k(r), r.get("n") or 3072, r["tokens"])
        if key not in best or r["time_us"] < best[key]["time_us"]:
            best[key] = r
    return {key: from_fields(r["tiling"]) if "tiling" in r else parse_label(r["config"]) for key, r in best.items()}


def shape_k(row: dict) -> int:
    """K of an older sweep row without one: MiniMax's intermediate 1536 over its TP."""
    return 1536 // row["tp"]
