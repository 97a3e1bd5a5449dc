# Source this on the GPU machine, at the checkout's root (`. scripts/gpu-env.sh`): it unpacks
# the packages scripts/gpu-bundle.sh put in .device/debs into /tmp/root (once per machine)
# and points pkg-config, the linker and the loader at them, so that a plain
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA_ARCHS=90a -DSMELT_WEBUI=OFF
# finds jansson, libmicrohttpd, PCRE2, libcurl and libyaml. libmicrohttpd's .pc file asks for
# gnutls's, which is not there: its Requires.private line goes. libcurl links against the
# machine's own libcurl.so.4 (Debian's wants libssh2 and ldap versions Ubuntu lacks).
if [ ! -d .device/debs ]; then
    echo "gpu-env: no .device/debs here (run scripts/gpu-bundle.sh on the development machine and carry .device)" >&2
    return 1 2>/dev/null || exit 1
fi
_gpu_root=/tmp/root
_gpu_lib=$_gpu_root/usr/lib/x86_64-linux-gnu
_gpu_sum=$(ls .device/debs/*.deb | md5sum | cut -c1-12)
if [ ! -f "$_gpu_root/.unpacked-$_gpu_sum" ]; then
    mkdir -p "$_gpu_root"
    for _f in .device/debs/*.deb; do dpkg -x "$_f" "$_gpu_root"; done
    sed -i '/Requires.private/d' "$_gpu_lib/pkgconfig/libmicrohttpd.pc"
    for _c in /usr/lib/x86_64-linux-gnu/libcurl.so.4 /lib/x86_64-linux-gnu/libcurl.so.4; do
        [ -e "$_c" ] && { ln -sf "$_c" "$_gpu_lib/libcurl.so"; break; }
    done
    touch "$_gpu_root/.unpacked-$_gpu_sum"
fi
export PKG_CONFIG_PATH=$_gpu_lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$_gpu_root
export LD_LIBRARY_PATH=$_gpu_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
unset _gpu_root _gpu_lib _gpu_sum _f _c
