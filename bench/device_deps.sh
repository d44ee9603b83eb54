# bench/device_deps.sh: sourced by the device scripts (bench/device_cuda*.sh) on the GPU
# machine, which reaches no registry: Debian's libcjson and libmicrohttpd packages from the
# carried .peer into /, and libmicrohttpd's own needs (gnutls and its kin) into /tmp/deps,
# used only where the host lacks them. .peer is ignored by git (.git/info/exclude); made here by
#   mkdir -p .peer && cd .peer && apt-get download libcjson1 libcjson-dev libmicrohttpd12 \
#     libmicrohttpd-dev libgnutls30 libnettle8 libhogweed6 libp11-kit0 libtasn1-6 libidn2-0 \
#     libunistring2 libgmp10 libffi8 && tar -xzf ~/.cache/hearth-peer/node-llama-cpp-*.tgz \
#     package/llama/gitRelease.bundle
for d in .peer/libcjson*.deb .peer/libmicrohttpd*.deb; do dpkg -x "$d" / ; done
ldconfig
if ! ldconfig -p | grep -q 'libgnutls.so.30 '; then
    for d in .peer/*.deb; do case $d in *cjson*|*microhttpd*) ;; *) dpkg -x "$d" /tmp/deps ;; esac; done
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu LDLIBS="-Wl,-rpath-link,/tmp/deps/usr/lib/x86_64-linux-gnu"
fi
