#!/usr/bin/env python3
"""Prints what TensorBoard reads from a keel run's event files, as one JSON object on stdout:

  {"scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, text], ...]}}

in the order TensorBoard holds them (files in name order, events in file order). It reads with
TensorBoard's own EventAccumulator, which checks both CRCs of every record, so a test that compares
this output with what keel logged checks the format end to end. Scalar values are TensorBoard's
float32 simple_value, widened to a double exactly (compare with float32(logged), not the logged
double). Text is decoded as UTF-8 (undecodable bytes as U+FFFD) and printed with JSON escapes.

Needs the `tensorboard` package (scripts/setup.sh installs it into keel's venv):
  ~/.cache/keel/torch-2.11.0/bin/python tests/tools/read_tensorboard.py RUN_DIR[/tensorboard]
Exit 1, with a message on stderr, when the directory holds no events file.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util


def _decode(value):
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def text_of(tensor_proto):
    """The text of a "text" plugin tensor: a string for keel's string scalars, a (nested) list of
    strings for the arrays other writers may log."""
    array = tensor_util.make_ndarray(tensor_proto)
    if array.ndim == 0:
        return _decode(array.item())
    return np.vectorize(_decode, otypes=[object])(array).tolist()


def read(logdir):
    # 0 keeps every event: the defaults sample scalars down to 10,000 and tensors to 10 per tag.
    size_guidance = {event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}
    acc = event_accumulator.EventAccumulator(logdir, size_guidance=size_guidance)
    acc.Reload()
    tags = acc.Tags()
    scalars = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in tags["scalars"]}
    texts = {}
    for tag in tags["tensors"]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "text":
            continue
        texts[tag] = [[e.step, text_of(e.tensor_proto)] for e in acc.Tensors(tag)]
    return {"scalars": scalars, "texts": texts}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", help="RUN_DIR/tensorboard, or RUN_DIR (its tensorboard/ is read)")
    args = parser.parse_args()
    logdir = args.dir
    if os.path.isdir(os.path.join(logdir, "tensorboard")):
        logdir = os.path.join(logdir, "tensorboard")
    if not glob.glob(os.path.join(logdir, "*tfevents*")):
        print(f"read_tensorboard.py: no events file in {logdir}", file=sys.stderr)
        return 1
    json.dump(read(logdir), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
