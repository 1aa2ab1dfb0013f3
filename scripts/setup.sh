#!/bin/sh
# Installs the Debian packages Spectra builds against, when missing.
# cJSON (JSON), PCRE2 (Unicode regex for pre-tokenizers), utf8proc (NFC),
# zlib (CRC32), clang (libFuzzer targets), python3 (bench/gpu/sass_ctrl.py's test),
# libmicrohttpd (spectra serve), python3-jinja2 (the chat template tests' oracle).
set -e
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
if [ -n "$need" ]; then
    echo "setup: installing$need"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get install -y $need >/dev/null 2>&1 || {
        $SUDO apt-get update >/dev/null && $SUDO apt-get install -y $need >/dev/null
    }
fi
