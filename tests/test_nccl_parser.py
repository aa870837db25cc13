"""Parser of nccl-tests output (autopar/calibration/nccl.py) on real logs and broken input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autopar.base.errors import InputError
from autopar.calibration.nccl import COLUMNS, parse_nccl_log, parse_nccl_text

DATA = Path(__file__).parent / "data" / "nccl"

# (file, collective, ranks, nodes, rows): from data/nccl-tests/SOURCES.md.
EXPECTED = [
    ("a100_16n8g_all_reduce_abci.log", "all_reduce", 128, 16, 24),
    ("a100_1n2g_sendrecv_ncclissue331.log", "send_recv", 2, 1, 29),
    ("a100_1n8g_all_gather_superbench.log", "all_gather", 8, 1, 34),
    ("a100_1n8g_all_reduce_abci.log", "all_reduce", 8, 1, 24),
    ("a100_1n8g_all_reduce_superbench.log", "all_reduce", 8, 1, 34),
    ("a100_1n8g_alltoall_superbench.log", "all_to_all", 8, 1, 34),
    ("a100_1n8g_reduce_scatter_superbench.log", "reduce_scatter", 8, 1, 34),
    ("a100_2n8g_all_reduce_abci.log", "all_reduce", 16, 2, 24),
    ("a100_2n8g_all_reduce_awsefaeks.log", "all_reduce", 16, 2, 30),
    ("a100_2n8g_all_reduce_ocitutorials.log", "all_reduce", 16, 2, 1),
    ("a100_4n8g_all_reduce_abci.log", "all_reduce", 32, 4, 24),
    ("a100_8n8g_all_reduce_abci.log", "all_reduce", 64, 8, 24),
    ("h100_1n8g_all_reduce_awsbatchp5.log", "all_reduce", 8, 1, 32),
    ("h100_1n8g_all_reduce_ncclissue290.log", "all_reduce", 8, 1, 6),
    ("h100_2n8g_all_reduce_gcpa3mega.log", "all_reduce", 16, 2, 31),
    ("h100_2n8g_all_reduce_ncclissue290.log", "all_reduce", 16, 2, 11),
    ("h100_2n8g_all_reduce_ncclissue309_gjaion.log", "all_reduce", 16, 2, 14),
    ("h100_2n8g_all_reduce_ncclissue309_xe9680.log", "all_reduce", 16, 2, 32),
    ("h100_8n8g_all_reduce_ncclissue309_gjaion.log", "all_reduce", 64, 8, 14),
    ("h200_2n8g_all_gather_skypilotgcp.log", "all_gather", 16, 2, 24),
    ("h200_2n8g_all_reduce_spectrumx.log", "all_reduce", 16, 2, 25),
]

HEADER = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
)
ROW = "     1048576        262144     float     sum      -1    71.93   14.58   27.33      0    71.47   14.67   27.51      0\n"  # noqa: E501
FOOTER = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 27.3\n#\n"


def test_every_log_is_listed():
    assert sorted(p.name for p in DATA.glob("*.log")) == sorted(e[0] for e in EXPECTED)


@pytest.mark.parametrize(("name", "collective", "ranks", "nodes", "rows"), EXPECTED)
def test_log_parses(name, collective, ranks, nodes, rows):
    frame = parse_nccl_log(DATA / name)
    assert list(frame.columns) == list(COLUMNS)
    assert len(frame) == rows
    assert set(frame["collective"]) == {collective}
    assert (frame["num_ranks"].iat[0], frame["num_nodes"].iat[0]) == (ranks, nodes)
    assert frame["time_us_out"].notna().all()
    assert (frame["size_bytes"].diff().dropna() >= 0).all()


def test_log_without_rank_lines_takes_ranks_from_file_name_and_says_so():
    frame = parse_nccl_log(DATA / "h100_1n8g_all_reduce_awsbatchp5.log")
    assert frame["num_ranks"].iat[0] == 8
    assert any("file name" in note for note in frame.attrs["notes"])


def test_gpu_name_comes_from_rank_lines():
    frame = parse_nccl_log(DATA / "h100_2n8g_all_reduce_ncclissue290.log")
    assert frame["gpu"].iat[0] == "H100 80GB HBM3"


def test_na_wrong_and_empty_alltoall_redop():
    frame = parse_nccl_log(DATA / "a100_1n8g_alltoall_superbench.log")
    assert frame["redop"].isna().all()
    assert frame["time_us_in"].iat[-1] == pytest.approx(33234)


def test_na_in_place_columns_read_as_nan():
    text = HEADER + ROW.replace("71.47   14.67   27.51", "  N/A     N/A     N/A") + FOOTER
    frame = parse_nccl_text(text, source="h100_2n8g_all_reduce_x.log")
    assert math.isnan(frame["time_us_in"].iat[0])
    assert frame["time_us_out"].iat[0] == pytest.approx(71.93)


@pytest.mark.parametrize("prefix", ["[1,0]<stdout>:", " 0: ", "1: "])
def test_launcher_prefixes_are_stripped(prefix):
    text = "".join(prefix + line + "\n" for line in (HEADER + ROW + FOOTER).splitlines())
    frame = parse_nccl_text(text, source="h100_2n8g_all_reduce_x.log")
    assert frame["size_bytes"].tolist() == [1048576]


def test_truncated_row_names_file_line_and_columns():
    text = HEADER + ROW + "     2097152        524288     float     sum\n" + FOOTER
    with pytest.raises(InputError, match=r"^log\.txt_2n8g_all_reduce: line 3: expected 13 columns"):
        parse_nccl_text(text, source="log.txt_2n8g_all_reduce")


def test_missing_footer_is_truncation():
    with pytest.raises(InputError, match="truncated"):
        parse_nccl_text(HEADER + ROW, source="h100_2n8g_all_reduce_x.log")


def test_garbage_number_names_the_column():
    text = HEADER + ROW.replace("71.93", "7x.93") + FOOTER
    with pytest.raises(InputError, match=r"line 2: column 'time \(out-of-place\)'"):
        parse_nccl_text(text, source="h100_2n8g_all_reduce_x.log")


def test_empty_file_raises(tmp_path):
    path = tmp_path / "h100_2n8g_all_reduce_empty.log"
    path.write_text("")
    with pytest.raises(InputError, match="empty"):
        parse_nccl_log(path)


def test_text_without_table_raises():
    with pytest.raises(InputError, match="no nccl-tests table header"):
        parse_nccl_text("hello\nworld\n", source="h100_2n8g_all_reduce_x.log")


def test_undeterminable_collective_raises_never_guesses():
    with pytest.raises(InputError, match="cannot determine the collective"):
        parse_nccl_text(HEADER + ROW + FOOTER, source="h100_2n8g_mystery.log")


def test_unsupported_collective_in_name_raises():
    with pytest.raises(InputError, match="'broadcast' is not supported"):
        parse_nccl_text(HEADER + ROW + FOOTER, source="h100_2n8g_broadcast_x.log")


def test_caller_contradicting_the_file_name_raises():
    with pytest.raises(InputError, match="conflicting collectives"):
        parse_nccl_log(DATA / "a100_2n8g_all_reduce_abci.log", collective="all_gather")


def test_busbw_ratio_contradicting_the_collective_raises(tmp_path):
    path = tmp_path / "cluster.log"
    path.write_text((DATA / "a100_2n8g_all_reduce_abci.log").read_text())
    with pytest.raises(InputError, match=r"busbw/algbw = 1\.87.*all_gather on 16 ranks"):
        parse_nccl_log(path, collective="all_gather")


def test_collective_test_starting_line_names_the_collective():
    text = "# Collective test starting: all_reduce_perf\n" + HEADER + ROW + FOOTER
    frame = parse_nccl_text(text, source="cluster_2n8g.log")
    assert frame["collective"].iat[0] == "all_reduce"
