#!/usr/bin/env bash
# The wheelhouse THORN's registry-free images install from (their build context `wheels`):
# every dependency in pyproject.toml and the build backend, as wheels, at the versions
# installed in the virtualenv that runs the tests. The images' builds then need no index
# and no network: `pip install --no-index --find-links`.
#
#   deploy/podman/wheels.sh            # PYTHON=.venv/bin/python, writes .cache/podman/wheels
#
# Cached: nothing is done when the requirements and the pinned versions are unchanged.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-.venv/bin/python}
OUT=${THORN_WHEELS:-.cache/podman/wheels}
mkdir -p "$OUT"

requirements=$("$PYTHON" - <<'PY'
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)
print("\n".join(project["project"]["dependencies"] + project["build-system"]["requires"]))
PY
)
# The virtualenv's versions as constraints (name==version lines only: no local paths).
pins=$("$PYTHON" -m pip freeze --exclude-editable | grep -E '^[A-Za-z0-9_.-]+==' || true)
inputs=$(printf '%s\n--\n%s\n' "$requirements" "$pins" | sha256sum | cut -c1-16)
if [ "$(cat "$OUT/.inputs" 2>/dev/null)" = "$inputs" ]; then
    echo "$OUT is up to date (inputs $inputs)"
    exit 0
fi

rm -f "$OUT"/*.whl "$OUT/.inputs"
printf '%s\n' "$requirements" > "$OUT/requirements.txt"
printf '%s\n' "$pins" > "$OUT/pins.txt"
"$PYTHON" -m pip wheel --quiet --wheel-dir "$OUT" \
    --requirement "$OUT/requirements.txt" --constraint "$OUT/pins.txt"
# The images pin what was resolved, and only that: a package added to the virtualenv for
# something else changes no image layer.
for wheel in "$OUT"/*.whl; do
    name_version=$(basename "$wheel" | cut -d- -f1,2)
    echo "${name_version%-*}==${name_version#*-}"
done | sort > "$OUT/constraints.txt"
rm -f "$OUT/pins.txt"
echo "$inputs" > "$OUT/.inputs"
echo "wheels in $OUT (inputs $inputs): $(ls "$OUT"/*.whl | wc -l)"
