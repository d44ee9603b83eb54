# bench/device_deps.sh: sourced by the device scripts (bench/device_cuda*.sh) on the GPU
# machine, which reaches no registry: Debian's libcjson and libmicrohttpd packages from the
# carried .peer/debs into /, and libmicrohttpd's own needs (gnutls and its kin) into /tmp/deps,
# used only where the host lacks them. .peer is ignored by git; bench/device_pack.sh makes it.
for d in .peer/debs/libcjson*.deb .peer/debs/libmicrohttpd*.deb; do dpkg -x "$d" / ; done
ldconfig
if ! ldconfig -p | grep -q 'libgnutls.so.30 '; then
    for d in .peer/debs/*.deb; do case $d in *cjson*|*microhttpd*) ;; *) dpkg -x "$d" /tmp/deps ;; esac; done
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu LDLIBS="-Wl,-rpath-link,/tmp/deps/usr/lib/x86_64-linux-gnu"
fi
