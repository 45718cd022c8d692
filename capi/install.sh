#!/usr/bin/env bash
# Installs libhipfile (shared and static), libhipfile_hip_cpu.so, the headers and the
# pkg-config files under a prefix.
#
#   cargo build --release -p hipfile-capi -p hipfile-hip-cpu
#   capi/install.sh [--prefix DIR] [--build-dir DIR] [--libdir DIR]
#
#   --prefix     install prefix (default /usr/local)
#   --build-dir  where cargo put the libraries (default: <repo>/target/release)
#   --libdir     library directory (default PREFIX/lib)
#
# Layout: PREFIX/include/{hipfile.h,hipfile_cpu.h,hipfile_ext.h}; LIBDIR/libhipfile.so.0 (the file,
# named by its soname) with the link libhipfile.so, libhipfile.a, libhipfile_hip_cpu.so;
# LIBDIR/pkgconfig/{hipfile.pc,hipfile-hip-cpu.pc}. Then:
#   PKG_CONFIG_PATH=LIBDIR/pkgconfig pkg-config --cflags --libs hipfile
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=/usr/local
build_dir=$here/../target/release
libdir=
while (($#)); do
  case $1 in
    --prefix) prefix=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --libdir) libdir=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
libdir=${libdir:-$prefix/lib}
includedir=$prefix/include
api_version=$(awk '/#define HIPFILE_VERSION_(MAJOR|MINOR|PATCH)/ {v = v (v == "" ? "" : ".") $3} END {print v}' "$here/include/hipfile.h")
for lib in libhipfile.so libhipfile.a libhipfile_hip_cpu.so; do
  [ -f "$build_dir/$lib" ] || { echo "install.sh: $build_dir/$lib not found (build first, or pass --build-dir)" >&2; exit 1; }
done
install -d "$includedir" "$libdir/pkgconfig"
install -m 644 "$here/include/hipfile.h" "$here/include/hipfile_cpu.h" "$here/include/hipfile_ext.h" "$includedir/"
install -m 755 "$build_dir/libhipfile.so" "$libdir/libhipfile.so.0"
ln -sf libhipfile.so.0 "$libdir/libhipfile.so"
install -m 644 "$build_dir/libhipfile.a" "$libdir/libhipfile.a"
install -m 755 "$build_dir/libhipfile_hip_cpu.so" "$libdir/libhipfile_hip_cpu.so"
for pc in hipfile hipfile-hip-cpu; do
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@LIBDIR@|$libdir|g" -e "s|@INCLUDEDIR@|$includedir|g" \
      -e "s|@API_VERSION@|$api_version|g" "$here/$pc.pc.in" > "$libdir/pkgconfig/$pc.pc"
done
echo "installed hipfile $api_version under $prefix (libraries in $libdir)"
