#!/usr/bin/env python3
"""Writes the records of a JSONL file as a parquet file with pyarrow (tests/integration/parquet_test.cpp).

Usage: jsonl_to_parquet.py IN.jsonl OUT.parquet [--row-group-size N]
Every record's keys become columns (strings stay strings, integers int64), in small row groups so
that the reader crosses row-group boundaries.
"""
import argparse
import json

import pyarrow as pa
import pyarrow.parquet as pq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--row-group-size", type=int, default=97)
    a = ap.parse_args()
    with open(a.input, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    pq.write_table(pa.Table.from_pylist(rows), a.output, row_group_size=a.row_group_size)


if __name__ == "__main__":
    main()
