"""Tilings in writing: labels (one table writes and parses them), key=value pairs and the sweep's JSON."""

import json
import re
from dataclasses import asdict, fields

import pytest

from b70bench.errors import UsageError
from b70bench.moe import configs, tune
from b70bench.moe.configs import Config

LABELS = [
    "m1n32k512s1w2st1sum-packed-paired",
    "m1n64k128s1w4st1fused-packed-paired-tiled-r96",
    "m16n128k128s1w4st3fused",
    "m2n32k64s2w4st2sum-tiled",
    "m1n32k256s1w2st1sum-packed-paired-pf-pdl-early-dq",
    "m1n32k512s1w4st1sum-packed-paired-tiled-o6-pdl-early-2r",
    "m1n16k512s2w2st1fused-packed-paired-tiled-r64-o12-pf-pdl-early-dq-2r",
    "m2n64k128s1w2st1sum-packed-paired-2r+m1n64k128s1w2st1sum-packed-paired-pf-2r",
]

# The positional pattern labels were parsed with before the table: what they meant then they mean now.
OLD = re.compile(
    r"m(\d+)n(\d+)k(\d+)s(\d+)w(\d+)st(\d+)(sum|fused)(-packed)?(-paired)?(-tiled)?(?:-r(\d+))?"
    r"(?:-o(\d+))?(-pf)?(-pdl)?(-early)?(-dq)?(-2r)?$"
)


def old_parse(label: str) -> Config:
    if "+" in label:
        pairs, odd_pairs = label.split("+")
        return Config(**{**asdict(old_parse(pairs)), "odd_pairs": old_parse(odd_pairs)})
    g = OLD.match(label).groups()
    return Config(
        *map(int, g[:6]),
        fused_reduce=g[6] == "fused",
        packed=bool(g[7]),
        paired=bool(g[8]),
        tiled=bool(g[9]),
        maxnreg=int(g[10] or 0),
        programs_per_sm=int(g[11] or 0),
        prefetch=bool(g[12]),
        pdl=bool(g[13]),
        early=bool(g[14]),
        dequant_early=bool(g[15]),
        two_rows=bool(g[16]),
    )


def test_one_table_names_every_field_once():
    names = [name for name, _ in configs.LABEL_TOKENS]
    assert sorted(names) == sorted(f.name for f in fields(Config) if f.name != "odd_pairs")
    assert configs.flag_order() == "-packed -paired -tiled -rN -oN -pf -pdl -early -dq -2r"


@pytest.mark.parametrize("label", LABELS)
def test_labels_parse_as_before_and_round_trip(label):
    cfg = configs.parse_label(label)
    assert cfg == old_parse(label)
    assert cfg.label() == label


@pytest.mark.parametrize(
    "label",
    [
        "m1n32",
        "m1n32k512s1w2st1sum-pf-packed",
        "m1n32k512s1w2st1sum-packedx",
        "m1n32k512s1w2st1sum-r",
        "m1n32k512s1w2st1avg",
        "a+b+c",
    ],
)
def test_what_is_not_a_label_is_refused(label):
    with pytest.raises(ValueError, match="not a tiling label"):
        configs.parse_label(label)


def test_tilings_take_field_names_or_the_sweeps_json():
    label = LABELS[-1]
    cfg = configs.parse_label(label)
    one = cfg.odd_pairs
    pairs = "block_m=1,block_n=64,block_k=128,num_warps=2,num_stages=1,packed=true,paired=1,prefetch=True,two_rows=yes"
    assert tune.parse_tiling(pairs) == one
    assert (
        tune.parse_tiling(
            f"block_m=2, block_n=64, num_warps=2, num_stages=1, packed=1, paired=1, two_rows=1, odd_pairs={one.label()}"
        )
        == cfg
    )
    assert tune.parse_tiling(json.dumps(asdict(cfg))) == cfg  # what a sweep row stores as its `tiling`
    assert tune.parse_tiling(json.dumps({"block_m": 1, "block_n": 32, "pdl": True})) == Config(1, 32, pdl=True)
    assert tune.parse_tiling(label) == cfg


@pytest.mark.parametrize("text", ["block_mm=1,block_n=32", '{"block_m": 1, "blockn": 32}'])
def test_a_bad_tiling_key_is_one_line_naming_the_keys(text):
    with pytest.raises(UsageError) as err:
        tune.parse_tiling(text)
    msg = str(err.value)
    assert "\n" not in msg and "unknown tiling key" in msg
    assert all(f.name in msg for f in fields(Config))


@pytest.mark.parametrize("text", ["block_m=one", "packed=maybe", "block_m", '{"block_m": 1', "[1, 2]"])
def test_bad_tiling_values_are_usage_errors(text):
    with pytest.raises(UsageError, match="--tilings"):
        tune.parse_tiling(text)


def test_cli_exits_2_on_a_bad_tiling_key(capsys):
    from b70bench.cli import main

    rc = main(["moe-down", "--backend", "cpu", "--tune", "--tilings", "block_m=1,warps=4"])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "unknown tiling key(s) warps" in err and "num_warps" in err


def test_tuned_file_gives_back_a_mixed_tiling(tmp_path):
    cfg = configs.parse_label(LABELS[-1])
    rows = [
        dict(tp=1, tokens=16, k=1536, n=3072, config=cfg.label(), tiling=asdict(cfg), ok=True, time_us=60.0),
        dict(tp=4, tokens=1, k=384, config="m1n32k256s1w2st1sum-packed-paired-pf-pdl-early-dq", ok=True, time_us=3.7),
    ]
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"records": rows}))
    tuned = configs.load_tuned(path)
    assert tuned[(1536, 3072, 16)] == cfg
    assert tuned[(1536, 3072, 16)].odd_pairs.label() == LABELS[-1].split("+")[1]
    assert tuned[(384, 3072, 1)] == configs.parse_label(rows[1]["config"])


def test_sweep_files_with_the_former_field_names_still_load():
    """Before the renames a stored tiling said `singles` and `per_sm`; they read as odd_pairs, programs_per_sm."""
    old = {**asdict(Config(block_m=2, block_n=64)), "singles": {"block_m": 1, "per_sm": 6}}
    del old["odd_pairs"]
    cfg = configs.from_fields(old)
    assert cfg.odd_pairs == Config(block_m=1, programs_per_sm=6)
    assert tune.parse_tiling("block_m=1,per_sm=6") == Config(block_m=1, programs_per_sm=6)
