#!/usr/bin/env bash
# scripts/check_guide.py must catch each kind of mistake tests/lint/guide/guide.md plants.
# usage: catches.sh KEEL SOURCE_DIR
set -u
keel="$1"; src="$2"
out="$(python3 "$src/scripts/check_guide.py" --keel "$keel" "$src/tests/lint/guide/guide.md")"
rc=$?
[ "$rc" = 1 ] || { echo "FAIL: expected exit 1, got $rc"; echo "$out"; exit 1; }
for want in 'guide.md:4: keel train: --max-steps: not an option' \
            'guide.md:5: keel train: configs/tiny.yml: no such config file' \
            'guide.md:6: keel validate: --set optim.learning_rate: not a config key' \
            'guide.md:7: `keel trian`: no such subcommand' \
            'guide.md:12: this block shows keel'"'"'s output without a regen marker' \
            '--print-config appears in no `keel validate` command'; do
  grep -qF -- "$want" <<<"$out" || { echo "FAIL: not caught: $want"; echo "$out"; exit 1; }
done
echo "every planted mistake caught"
