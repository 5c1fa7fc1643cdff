#!/usr/bin/env bash
# Installs the guest kernel of microvm and vm sandboxes into DEST (default /usr/local/lib/dsec/guest-kernel):
#   vmlinux        the uncompressed ELF kernel (PVH entry point: QEMU boots it directly, no firmware, no bzImage)
#   modules/*.ko   what the guest needs that is not built in (virtio transports and devices, erofs, overlay,
#                  the balloon's free page reporting), with their dependencies, uncompressed
#   modules.order  those modules' file names in load order (dependencies first); the agent loads them as PID 1
#   VERSION        the package and kernel release installed
# Debian's cloud kernel is small and has PVH support. Idempotent and quiet when a kernel is already there: a newer
# one is only installed with --update.
set -euo pipefail

update=0
dest=/usr/local/lib/dsec/guest-kernel
for arg in "$@"; do
  case "$arg" in
    --update) update=1 ;;
    -h | --help)
      echo "usage: $0 [--update] [DEST]"
      exit 0
      ;;
    *) dest="$arg" ;;
  esac
done

if [ "$update" = 0 ] && [ -s "$dest/VERSION" ] && [ -s "$dest/vmlinux" ] && [ -f "$dest/modules.order" ]; then
  exit 0
fi

log() { echo "fetch-guest-kernel: $*" >&2; }
die() {
  log "$*"
  exit 1
}
for tool in apt-cache apt-get dpkg-deb depmod readelf xz zstd gzip bzip2 lz4 od; do
  command -v "$tool" >/dev/null || [ "$tool" = lz4 ] || [ "$tool" = bzip2 ] || die "needs $tool"
done

# The newest real package behind the metapackage (linux-image-cloud-amd64 depends on linux-image-<release>-cloud-amd64).
package=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
  sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-cloud-amd64\)$/\1/p' | head -n1)
if [ -z "$package" ]; then
  apt-get update -q >/dev/null
  package=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-cloud-amd64\)$/\1/p' | head -n1)
fi
[ -n "$package" ] || die "cannot resolve linux-image-cloud-amd64 (apt-get update?)"
version=$(apt-cache policy "$package" | sed -n 's/^ *Candidate: //p')
stamp="$package $version"
if [ "$update" = 1 ] && [ -s "$dest/VERSION" ] && [ "$(head -n1 "$dest/VERSION")" = "$stamp" ] &&
  [ -s "$dest/vmlinux" ]; then
  exit 0
fi
log "installing $stamp into $dest"

work=$(mktemp -d /tmp/dsec-guest-kernel-XXXXXX)
trap 'rm -rf "$work"' EXIT
# apt-get download writes into the current directory; as root it also warns that it runs unsandboxed.
(cd "$work" && chmod 0777 . && apt-get download -q "$package" >/dev/null 2>"$work/download.log") ||
  die "apt-get download $package failed: $(tail -n3 "$work/download.log")"
dpkg-deb -x "$work"/"$package"_*.deb "$work/root"
bzimage=$(ls "$work"/root/boot/vmlinuz-* | head -n1)
release=${bzimage##*/vmlinuz-}
moddir="$work/root/lib/modules/$release"
[ -d "$moddir" ] || die "no modules for $release in the package"
# The package ships no modules.dep (its postinst makes it): make it here.
depmod -b "$work/root" "$release" || die "depmod failed"

# The bzImage holds the kernel ELF compressed; find the payload by its magic and decompress it.
extract_vmlinux() {
  local image=$1 out=$2 magic tool offset
  for pair in "fd377a585a00:xz -dc" "28b52ffd:zstd -dcq" "1f8b0800:gzip -dc" "5d000000:xz -dc --format=lzma" \
    "425a68:bzip2 -dc" "02214c18:lz4 -dc"; do
    magic=${pair%%:*}
    tool=${pair#*:}
    command -v "${tool%% *}" >/dev/null || continue
    # Byte offsets of every occurrence of the magic.
    for offset in $(LC_ALL=C grep -obUaP "$(echo "$magic" | sed 's/../\\x&/g')" "$image" | cut -d: -f1); do
      tail -c +$((offset + 1)) "$image" | $tool >"$out" 2>/dev/null || true
      if [ "$(head -c4 "$out" | od -An -tx1 | tr -d ' ')" = "7f454c46" ]; then
        return 0
      fi
    done
  done
  return 1
}
extract_vmlinux "$bzimage" "$work/vmlinux" || die "no ELF kernel found inside $bzimage"
# QEMU boots an ELF kernel through its PVH entry point (Xen ELF note XEN_ELFNOTE_PHYS32_ENTRY = 18).
readelf -n "$work/vmlinux" | grep -A1 -E '^ +Xen ' | grep -qiE '0x00000012|PHYS32_ENTRY' ||
  die "$release has no PVH entry point (Xen ELF note 18)"

# Modules the guest needs that are not built in, then their dependencies (modules.dep), dependencies first.
wanted=(virtio virtio_ring virtio_mmio virtio_pci virtio_blk virtio_console virtio_balloon erofs overlay)
declare -A seen=()
order=()
path_of() { # module name -> its path in modules.dep ("kernel/.../name.ko[.xz]"), empty when built in or absent
  local name=$1 alt=${1//_/-}
  awk -F: -v a="/$name.ko" -v b="/$alt.ko" '{ p = $1; sub(/\.(xz|zst|gz)$/, "", p) }
    (substr(p, length(p) - length(a) + 1) == a || substr(p, length(p) - length(b) + 1) == b) { print $1; exit }' \
    "$moddir/modules.dep"
}
visit() { # path -> appends its dependencies, then itself, to order
  local path=$1 dep
  [ -n "${seen[$path]:-}" ] && return 0
  seen[$path]=1
  for dep in $(awk -F: -v p="$path" '$1 == p { print $2 }' "$moddir/modules.dep"); do
    visit "$dep"
  done
  order+=("$path")
}
for name in "${wanted[@]}"; do
  if grep -qE "/(${name}|${name//_/-})\.ko$" "$moddir/modules.builtin"; then
    continue
  fi
  path=$(path_of "$name")
  if [ -z "$path" ]; then
    log "warning: module $name is neither built in nor shipped by $release"
    continue
  fi
  visit "$path"
done

stage="$work/out"
mkdir -p "$stage/modules"
: >"$stage/modules.order"
for path in "${order[@]}"; do
  base=${path##*/}
  case "$base" in
    *.ko.xz) xz -dc "$moddir/$path" >"$stage/modules/${base%.xz}" && base=${base%.xz} ;;
    *.ko.zst) zstd -dcq "$moddir/$path" >"$stage/modules/${base%.zst}" && base=${base%.zst} ;;
    *.ko.gz) gzip -dc "$moddir/$path" >"$stage/modules/${base%.gz}" && base=${base%.gz} ;;
    *) cp "$moddir/$path" "$stage/modules/$base" ;;
  esac
  echo "$base" >>"$stage/modules.order"
done
cp "$work/vmlinux" "$stage/vmlinux"
printf '%s\n%s\n' "$stamp" "$release" >"$stage/VERSION"

# Replace DEST as a whole, so a reader never sees a kernel with another kernel's modules.
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.new"
mv "$stage" "$dest.new"
chmod -R a+rX "$dest.new"
rm -rf "$dest.old"
[ -e "$dest" ] && mv "$dest" "$dest.old"
mv "$dest.new" "$dest"
rm -rf "$dest.old"
log "installed $release: vmlinux and ${#order[@]} modules"
