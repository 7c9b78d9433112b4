"""The tensor-parallel rows of the benchmark (arcpy/bench/parallel.py): their table from a report,
CPU tier (the rows themselves are measured on GPUs)."""

from arcpy.bench.parallel import format_rows


def test_the_rows_show_the_split_beside_the_whole_and_an_error_as_it_came():
    rate = lambda us, waits=0.0: {"us_per_token": us, "host_waits_per_token": waits, "path": "device-loop"}  # noqa: E731
    rows = [{"shape": "llama8B", "tensor_parallel": 2, "whole": {"greedy": rate(4000.0), "sampled": rate(4100.0)},
             "split": {"greedy": rate(2500.0), "sampled": rate(2600.0, 0.5)}},
            {"shape": "gqa", "tensor_parallel": 2, "error": "no CUDA device"}]
    text = format_rows(rows).splitlines()
    assert text[0] == ("  llama8B over 2 GPU(s), greedy: whole 4000.0 us/token, split 2500.0 us/token (1.60x), "
                       "host waits a token 0.00")
    assert text[1].endswith("(1.58x), host waits a token 0.50")
    assert text[2] == "  gqa over 2 GPU(s): no CUDA device"
