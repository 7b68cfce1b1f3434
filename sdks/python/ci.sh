#!/usr/bin/env bash
# The Python SDK's CI: a venv under target/ (created or reused) with pinned pytest, httpx and
# mypy from PyPI and this package installed from ./sdks/python (not editable, so the tests run
# the package as built); then mypy --strict, the unit and socket tests, the conformance runner
# against the testbench, and the fleet run against `oncely serve`. Also: `pip install
# ./sdks/python` in a fresh venv (and the unit tests there, on the newest httpx the range allows),
# and the unit tests on Python 3.9 when one is installed.
#
# Environment: ONCELY_TESTBENCH_URL (a running `oncely testbench`; without it the runner starts
# "$ONCELY_BIN testbench" itself) and ONCELY_BIN (the built `oncely` binary, default
# target/debug/oncely). Exits non-zero on any failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

HTTPX=0.28.1
PYTEST=9.2.0
PYTEST_39=8.3.5
MYPY=2.4.1
VENV=target/sdk-python-venv
export ONCELY_BIN=${ONCELY_BIN:-$root/target/debug/oncely}

pins="httpx==$HTTPX pytest==$PYTEST mypy==$MYPY"
if ! [ -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.oncely-pins" 2>/dev/null)" != "$pins" ]; then
  echo "== python sdk: venv $VENV ($pins)"
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install -q $pins
  echo "$pins" >"$VENV/.oncely-pins"
fi
echo "== python sdk: pip install ./sdks/python"
"$VENV/bin/pip" install -q --force-reinstall --no-deps ./sdks/python

echo "== python sdk: pip install ./sdks/python in a fresh venv"
fresh=target/sdk-python-fresh-venv
rm -rf "$fresh"
python3 -m venv "$fresh"
"$fresh/bin/pip" install -q ./sdks/python
"$fresh/bin/python" - <<'PY'
import pathlib, httpx, oncely
assert pathlib.Path(oncely.__file__).with_name("py.typed").exists()
httpx.Client(transport=oncely.RetryTransport()).close()
print(f"oncely {oncely.__version__} with httpx {httpx.__version__}: installed and importable")
PY
# The unit tests again, in that venv: against the newest httpx the package's range allows.
"$fresh/bin/pip" install -q "pytest==$PYTEST"
(cd sdks/python && "$root/$fresh/bin/python" -m pytest -q -p no:cacheprovider tests --ignore=tests/test_conformance.py)

echo "== python sdk: mypy --strict"
(cd sdks/python && "$root/$VENV/bin/mypy" --strict src tests)

echo "== python sdk: unit, socket and README tests"
(cd sdks/python && "$root/$VENV/bin/python" -m pytest -q -p no:cacheprovider tests --ignore=tests/test_conformance.py)

py39=""
for candidate in python3.9 "$HOME"/.pyenv/versions/3.9*/bin/python3.9; do
  if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 9)' 2>/dev/null; then
    py39=$candidate
    break
  fi
done
if [ -n "$py39" ]; then
  echo "== python sdk: the unit tests on Python 3.9 ($py39)"
  V39=target/sdk-python39-venv
  pins39="httpx==$HTTPX pytest==$PYTEST_39"
  if ! [ -x "$V39/bin/python" ] || [ "$(cat "$V39/.oncely-pins" 2>/dev/null)" != "$pins39" ]; then
    "$py39" -m venv "$V39"
    # shellcheck disable=SC2086
    "$V39/bin/pip" install -q $pins39
    echo "$pins39" >"$V39/.oncely-pins"
  fi
  "$V39/bin/pip" install -q --force-reinstall --no-deps ./sdks/python
  (cd sdks/python && "$root/$V39/bin/python" -m pytest -q -p no:cacheprovider tests --ignore=tests/test_conformance.py)
else
  echo "== python sdk: no Python 3.9 on this machine; the 3.9 run is left out"
fi

echo "== python sdk: conformance (conformance/retry/scenarios.json, sync and async)"
(cd sdks/python && ONCELY_CONFORMANCE_REQUIRED=1 "$root/$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_conformance.py)

echo "== python sdk: fleet of payments through oncely serve and the fault proxy"
"$VENV/bin/python" sdks/python/tests/fleet_client.py --bin "$ONCELY_BIN"
