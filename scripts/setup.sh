#!/bin/sh
# Installs the Debian packages Spectra builds against, when missing.
# cJSON (JSON), PCRE2 (Unicode regex for pre-tokenizers), utf8proc (NFC),
# zlib (CRC32), clang (libFuzzer targets), python3 (bench/gpu/sass_ctrl.py's test),
# libmicrohttpd (spectra serve), python3-jinja2 (the chat template tests' oracle),
# nodejs and npm (the openai client that tests/test_serve.c drives the server with).
set -e
cd "$(dirname "$0")/.."
need=""
[ -f /usr/include/cjson/cJSON.h ] || need="$need libcjson-dev"
[ -f /usr/include/pcre2.h ] || need="$need libpcre2-dev"
[ -f /usr/include/utf8proc.h ] || need="$need libutf8proc-dev"
[ -f /usr/include/zlib.h ] || need="$need zlib1g-dev"
command -v cc >/dev/null 2>&1 || need="$need gcc"
command -v make >/dev/null 2>&1 || need="$need make"
command -v clang >/dev/null 2>&1 || need="$need clang libclang-rt-dev"
command -v python3 >/dev/null 2>&1 || need="$need python3" # bench/gpu/sass_ctrl.py's test (CUDA builds)
[ -f /usr/include/microhttpd.h ] || need="$need libmicrohttpd-dev"
/usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1 || need="$need python3-jinja2"
command -v npm >/dev/null 2>&1 || need="$need nodejs npm"
command -v curl >/dev/null 2>&1 || need="$need curl"
if [ -n "$need" ]; then
    echo "setup: installing$need"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get install -y $need >/dev/null 2>&1 || {
        $SUDO apt-get update >/dev/null && $SUDO apt-get install -y $need >/dev/null
    }
fi

# The openai npm client (version pinned in tests/serve/package.json and its
# lock file) into the git-ignored .dev/node, for tests/test_serve.c; again
# only when the lock file changed.
if [ ! -f .dev/node/node_modules/openai/package.json ] || ! cmp -s tests/serve/package-lock.json .dev/node/package-lock.json; then
    echo "setup: npm ci (tests/serve: the openai client) into .dev/node"
    mkdir -p .dev/node
    cp tests/serve/package.json tests/serve/package-lock.json .dev/node/
    (cd .dev/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
