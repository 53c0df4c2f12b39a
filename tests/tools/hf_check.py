#!/usr/bin/env python3
"""Loads a `keel export --format hf` directory with Hugging Face transformers and checks it.

  hf_check.py DIR --logits FILE [--tol 1e-4] [--prompt TEXT]
      FILE: keel's logits, JSON {"ids": [...], "logits": [[V floats] per position]} (what
      `keel sample CHECKPOINT --prompt TEXT --tokens 0 --dump-logits FILE` writes). Runs the same
      ids through AutoModelForCausalLM (float32, eager attention), prints one JSON line
      {"max_abs_diff", "positions", "vocab", "architecture"} and exits 1 when the largest
      difference exceeds --tol. With --prompt, AutoTokenizer must also encode TEXT to FILE's ids.
  hf_check.py DIR --greedy PROMPT N [--json]
      Greedy generation of N tokens after PROMPT (encoded by AutoTokenizer, no bos added), not
      stopping at eos, as keel's greedy sampling does; prints the decoded text (prompt and
      continuation, special tokens kept), or with --json {"prompt_ids", "ids", "text",
      "continuation"}.
Exit status: 0 ok, 1 the check failed, 2 bad arguments or DIR does not load.
"""
import argparse
import json
import os
import sys

# DIR is local: never ask the Hub (a missing DIR would otherwise turn into a download attempt).
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load(path, need_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path) if need_tokenizer else None
    return model, tokenizer


def check_logits(args):
    import torch

    with open(args.logits) as f:
        keel = json.load(f)
    ids = [int(i) for i in keel["ids"]]
    expected = torch.tensor(keel["logits"], dtype=torch.float32)
    model, tokenizer = load(args.dir, args.prompt is not None)
    if args.prompt is not None:
        encoded = tokenizer(args.prompt, add_special_tokens=False)["input_ids"]
        if encoded != ids:
            print(f"tokenizer: {args.prompt!r} encodes to {encoded}, keel's ids are {ids}",
                  file=sys.stderr)
            return 1
    with torch.no_grad():
        got = model(torch.tensor([ids])).logits[0].float()
    if got.shape != expected.shape:
        print(f"shape: transformers gives {list(got.shape)}, keel {list(expected.shape)}",
              file=sys.stderr)
        return 1
    diff = (got - expected).abs().max().item()
    print(json.dumps({"max_abs_diff": diff, "positions": got.shape[0], "vocab": got.shape[1],
                      "architecture": type(model).__name__}))
    return 0 if diff <= args.tol else 1


def greedy(args):
    import torch

    prompt, n = args.greedy[0], int(args.greedy[1])
    model, tokenizer = load(args.dir, True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    # keel samples exactly N tokens: no stop at the boundary token.
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(
            1, len(prompt_ids), dtype=torch.long), max_new_tokens=n,
            do_sample=False, pad_token_id=0)
    ids = out[0].tolist()[len(prompt_ids):]
    text = tokenizer.decode(prompt_ids + ids, skip_special_tokens=False)
    if args.json:
        print(json.dumps({"prompt_ids": prompt_ids, "ids": ids, "text": text,
                          "continuation": tokenizer.decode(ids, skip_special_tokens=False)}))
    else:
        print(text)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="a Hugging Face model directory (keel export --format hf)")
    p.add_argument("--logits", help="keel's logits as JSON {ids, logits}")
    p.add_argument("--tol", type=float, default=1e-4, help="largest allowed |difference|")
    p.add_argument("--prompt", help="with --logits: text the tokenizer must encode to the ids")
    p.add_argument("--greedy", nargs=2, metavar=("PROMPT", "N"), help="greedy generation")
    p.add_argument("--json", action="store_true", help="with --greedy: a JSON line")
    args = p.parse_args()
    if (args.logits is None) == (args.greedy is None):
        p.error("pass exactly one of --logits FILE and --greedy PROMPT N")
    if not os.path.isfile(os.path.join(args.dir, "config.json")):
        print(f"error: {args.dir}: no config.json (not a Hugging Face model directory)",
              file=sys.stderr)
        return 2
    try:
        return check_logits(args) if args.logits else greedy(args)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
