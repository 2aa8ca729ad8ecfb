#!/usr/bin/env bash
# tests/softroce/run.sh - run host-built programs against REAL RDMA verbs (Soft-RoCE,
# the kernel's rdma_rxe driver) inside one or two QEMU guests.
#
# Why a VM: the host has no RDMA hardware and its kernel may lack rdma_rxe. Debian's stock
# kernel has it, so we boot that kernel under QEMU with a tiny busybox initramfs assembled
# from host packages (no image download other than the Debian kernel .deb), load rdma_rxe,
# bind an rxe device to the guest's virtio NIC, and run the caller's programs there.
#
# Usage:
#   tests/softroce/run.sh [--mode single|pair] [--dir DIR] [--] 'GUEST SHELL COMMAND'
#
#   --dir DIR   host directory copied into every guest as /extra (cwd of the command); the
#               shared-library closure of every dynamic ELF in it is copied along, so host
#               `cargo test --no-run` binaries run unchanged.
#   COMMAND     run by /bin/sh in every guest after rxe0 is up. Exported to it:
#                 SR_ROLE   single | server | client
#                 SR_IP     this guest's IPv4 address;  SR_PEER  the other guest's (pair mode)
#                 SR_DEV    rxe0
#                 SYMPHONY_REQUIRE_RDMA=1   (tests must not skip for lack of a device here)
#               Its exit status is the guest's result; any guest failing fails the script.
#   --mode single (default): one VM (2 vCPUs); rxe0 talks to its own IP (rxe loopback path).
#   --mode pair: two VMs (1 vCPU each) on a private L2 link made of a UDP socket pair on
#               127.0.0.1: 10.0.0.1 (server) and 10.0.0.2 (client). Nothing leaves the host.
#
# The guest image carries perftest (ib_read_lat, ib_send_lat, ib_read_bw, ...), ibv_devinfo,
# ibv_rc_pingpong and the `rdma` tool, so a command can compare against them.
#
# Environment knobs:
#   SOFTROCE_WORK=dir  cache dir (default: <repo>/.softroce-work, gitignored). Holds the
#                      kernel (downloaded once with `apt-get download`) and the cached base
#                      initramfs; per-run files go in a fresh subdir.
#   ACCEL=auto|kvm|tcg auto = KVM only if kvm_intel/kvm_amd is loaded and /dev/kvm opens;
#                      otherwise TCG (a PVM-backed /dev/kvm cannot boot stock kernels).
#   MEM=1G  SMP=n  TIMEOUT=300 (per-VM wall-clock limit, seconds)
#   SOFTROCE_QUIET=1   print only the guest command's own output and the summary
#
# Exit status: 0 if every guest's command exited 0, 1 otherwise, 2 on setup errors.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d'; }
MODE=${MODE:-single}
EXTRA_DIR=""
while [ $# -gt 0 ]; do
  case $1 in
    --mode) MODE=$2; shift 2 ;;
    --dir) EXTRA_DIR=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
done
GUEST_CMD=${*:-true}
case $MODE in single|pair) ;; *) echo "bad --mode $MODE" >&2; exit 2 ;; esac

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$SCRIPT_DIR/../.." && pwd)
WORK=${SOFTROCE_WORK:-$REPO/.softroce-work}
ACCEL=${ACCEL:-auto}
MEM=${MEM:-1G}
# single: 2 vCPUs (a server and a client thread both busy-poll; with 1 vCPU every wakeup
# waits for a ~4 ms scheduler tick). pair: 2 VMs x 1 vCPU fits a 2-core host under TCG.
if [ "$MODE" = pair ]; then SMP=${SMP:-1}; else SMP=${SMP:-2}; fi
TIMEOUT=${TIMEOUT:-300}

ts() { date +%s.%N; }
el() { awk -v a="$1" -v b="$(ts)" 'BEGIN{printf "%.1f", b-a}'; }
log() { echo "[softroce] $*" >&2; }
T0=$(ts)
mkdir -p "$WORK"; WORK=$(cd "$WORK" && pwd)

########## 1. host packages (Debian archive only) ##########
PKGS="qemu-system-x86 busybox-static kmod cpio perftest ibverbs-utils ibverbs-providers
      libibverbs1 rdma-core iproute2 xz-utils"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  log "apt-get install$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

########## 2. Debian generic kernel (the -cloud- flavour has NO rdma_rxe.ko) ##########
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$KPKG" ] || { log "cannot resolve linux-image-amd64 (run apt-get update)"; exit 2; }
KVER=${KPKG#linux-image-}
KDIR=$WORK/kernel-$KVER
if [ ! -f "$KDIR/.done" ]; then
  log "fetching $KPKG"
  rm -rf "$KDIR"; mkdir -p "$KDIR"
  (cd "$WORK" && apt-get download "$KPKG" 2>&1 | grep -v 'Download is performed unsandboxed' || true)
  dpkg-deb -x "$WORK/${KPKG}"_*.deb "$KDIR"
  rm -f "$WORK/${KPKG}"_*.deb
  depmod -b "$KDIR" "$KVER"        # the .deb ships no modules.dep
  # Uncompressed ELF vmlinux (it has a PVH entry note): QEMU boots it directly, skipping
  # SeaBIOS's bzImage path and the xz decompressor, ~2.5 s faster per boot under TCG.
  ( set +o pipefail
    pos=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$KDIR/boot/vmlinuz-$KVER" | head -1 | cut -d: -f1)
    [ -n "$pos" ] && tail -c +$((pos + 1)) "$KDIR/boot/vmlinuz-$KVER" | xz -dc --single-stream > "$KDIR/vmlinux" 2>/dev/null
  ) && [ "$(head -c 4 "$KDIR/vmlinux" | od -An -c | tr -d ' ')" = '177ELF' ] || rm -f "$KDIR/vmlinux"
  touch "$KDIR/.done"
fi
KERNEL=$KDIR/boot/vmlinuz-$KVER
[ -f "$KDIR/vmlinux" ] && KERNEL=$KDIR/vmlinux
MODDIR=$KDIR/lib/modules/$KVER

########## 3. initramfs = cached base archive + per-run archive (Linux unpacks both) ##########
put() { # $1=root $2=file: copy to the same symlink-resolved dir under root, keeping its name
  local d; d=$(readlink -f "$(dirname "$2")"); mkdir -p "$1$d"; cp -L "$2" "$1$d/$(basename "$2")"; }
put_libs() { # $1=root $2...=ELF files: copy their shared-library closure (ldd is recursive)
  local root=$1 b lib; shift
  for b in "$@"; do
    for lib in $(ldd "$b" 2>/dev/null | awk '/=> \//{print $3} /^[ \t]*\//{print $1}'); do
      [ -e "$root$(readlink -f "$(dirname "$lib")")/$(basename "$lib")" ] || put "$root" "$lib"
    done
  done
}

# The base image depends only on this script, the kernel and the host packages.
BASE_KEY=$( { cat "$0"; echo "$KVER"; dpkg-query -W perftest ibverbs-providers libibverbs1 busybox-static iproute2; } | md5sum | cut -c1-12)
BASE=$WORK/base-$BASE_KEY.cpio
if [ ! -f "$BASE" ]; then
  TB=$(ts)
  ROOT=$WORK/rootfs-base
  rm -rf "$ROOT" "$WORK"/base-*.cpio
  mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,tmp,run,root,extra}
  ln -s usr/bin "$ROOT/bin"; ln -s usr/sbin "$ROOT/sbin"; ln -s usr/lib "$ROOT/lib"; ln -s usr/lib64 "$ROOT/lib64"
  cp /bin/busybox "$ROOT/usr/bin/busybox"
  for a in $(/bin/busybox --list); do [ -e "$ROOT/usr/bin/$a" ] || ln -s busybox "$ROOT/usr/bin/$a"; done
  BINS="/usr/bin/rdma /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong
        /usr/bin/ib_read_lat /usr/bin/ib_send_lat /usr/bin/ib_write_lat /usr/bin/ib_read_bw
        /usr/bin/ib_send_bw /usr/bin/ib_write_bw"
  # libibverbs loads the rxe provider with dlopen (ldd cannot see it), and Rust programs
  # built on rdma-mummy-sys (sideway) dlopen libibverbs.so.1 itself: copy both explicitly.
  MA=/usr/lib/x86_64-linux-gnu
  LIBS="$MA/libibverbs/librxe-rdmav34.so $MA/libibverbs.so.1 $MA/librdmacm.so.1"
  for b in $BINS $LIBS; do [ -e "$b" ] && put "$ROOT" "$b"; done
  # shellcheck disable=SC2086
  put_libs "$ROOT" $BINS $LIBS
  mkdir -p "$ROOT/etc/libibverbs.d"
  cp /etc/libibverbs.d/rxe.driver "$ROOT/etc/libibverbs.d/"
  # Kernel modules in dependency order from modules.dep. crc32_generic: rxe needs the
  # "crc32" crypto shash, which is =m in Debian's config and nothing would autoload it.
  order=""
  add_mod() {
    local rel deps d
    rel=$(awk -F: -v m="/$1.ko" 'substr($1,length($1)-length(m)+1)==m {print $1; exit}' "$MODDIR/modules.dep")
    [ -n "$rel" ] || { log "module $1 not found"; exit 2; }
    case " $order " in *" $rel "*) return;; esac
    deps=$(awk -F: -v r="$rel" '$1==r{print $2}' "$MODDIR/modules.dep")
    for d in $deps; do add_mod "$(basename "$d" .ko)"; done
    order="$order $rel"
  }
  for m in virtio_pci virtio_net crc32_generic rdma_rxe; do add_mod "$m"; done
  for rel in $order; do
    mkdir -p "$ROOT/lib/modules/$KVER/$(dirname "$rel")"; cp "$MODDIR/$rel" "$ROOT/lib/modules/$KVER/$rel"
  done
  # shellcheck disable=SC2086
  printf '%s\n' $order > "$ROOT/etc/modules.order"
  cat > "$ROOT/init" <<'EOF'
#!/bin/sh
# Guest init: bring up rxe0 on eth0, run /etc/guest_cmd in /extra, report, power off.
export PATH=/usr/bin:/usr/sbin HOME=/root
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
up() { cut -d' ' -f1 /proc/uptime; }
for a in $(cat /proc/cmdline); do case $a in sr.*=*) k=${a%%=*}; eval "${k#sr.}='${a#*=}'";; esac; done
role=${role:-single}; ip=${ip:-10.0.0.1}; peer=${peer:-$ip}
echo "SR: kernel $(uname -r) at $(up)s, role=$role ip=$ip peer=$peer"
for rel in $(cat /etc/modules.order); do insmod /lib/modules/$(uname -r)/$rel || echo "SR: insmod $rel FAILED"; done
ip link set lo up
ip link set eth0 up && ip addr add $ip/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || echo "SR: rdma link add FAILED"
ibv_devinfo -d rxe0 | grep -E 'hca_id|state|active_mtu|link_layer' | tr -s ' \t' ' '
echo "SR: rxe0 ready at $(up)s"
export SR_ROLE=$role SR_IP=$ip SR_PEER=$peer SR_DEV=rxe0 SYMPHONY_REQUIRE_RDMA=1
echo "SR: >>> guest command"
(cd /extra && sh /etc/guest_cmd); r=$?
echo "SR: <<< guest command rc=$r"
echo "SR: RESULT rc=$r at $(up)s"
poweroff -f
EOF
  chmod +x "$ROOT/init"
  (cd "$ROOT" && find . | cpio -o -H newc --quiet) > "$BASE.tmp" && mv "$BASE.tmp" "$BASE"
  rm -rf "$ROOT"
  log "base initramfs built: $(du -h "$BASE" | cut -f1) ($(el "$TB")s)"
fi

RUN=$(mktemp -d "$WORK/run.XXXXXX")
trap 'rm -rf "$RUN"' EXIT
ROOT=$RUN/root
mkdir -p "$ROOT/extra" "$ROOT/etc"
if [ -n "$EXTRA_DIR" ]; then
  cp -a "$EXTRA_DIR"/. "$ROOT/extra/"
  # libraries the base image does not have yet (files of the base are not re-added)
  mkdir -p "$RUN/basefiles"
  (cd "$RUN/basefiles" && cpio -it --quiet < "$BASE" | sed 's|^\./||' > "$RUN/base.list")
  while IFS= read -r f; do
    head -c 4 "$f" | grep -q 'ELF' || continue
    for lib in $(ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^[ \t]*\//{print $1}'); do
      rel=$(readlink -f "$(dirname "$lib")")/$(basename "$lib"); rel=${rel#/}
      grep -qxF "$rel" "$RUN/base.list" || [ -e "$ROOT/$rel" ] || put "$ROOT" "$lib"
    done
  done < <(find "$ROOT/extra" -type f)
fi
printf '%s\n' "$GUEST_CMD" > "$ROOT/etc/guest_cmd"
(cd "$ROOT" && find . -mindepth 1 | cpio -o -H newc --quiet) > "$RUN/extra.cpio"
cat "$BASE" "$RUN/extra.cpio" > "$RUN/initrd.cpio"
log "setup $(el "$T0")s (kernel $KVER, initrd $(du -h "$RUN/initrd.cpio" | cut -f1))"

########## 4. boot ##########
if [ "$ACCEL" = auto ]; then
  ACCEL=tcg
  if [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; then
    { exec 3<>/dev/kvm; } 2>/dev/null && ACCEL=kvm && exec 3>&-
  fi
fi
if [ "$ACCEL" = kvm ]; then ACC="-accel kvm -cpu host"; else ACC="-accel tcg,thread=multi -cpu max"; fi
# tsc=reliable: under TCG the kernel finds the vCPUs' TSCs "unsynchronized" and falls back
# to the HPET clocksource, whose every read (clock_gettime, Instant::now) is an emulated MMIO
# access costing microseconds. QEMU derives all vCPUs' TSCs from one virtual clock, so the
# TSC is in fact consistent, and timing code in the guest stays cheap and comparable to
# perftest (which reads the TSC directly).
qemu() { # $1=log file  $2=extra kernel args  $3...=netdev/device args
  local logf=$1 extra=$2; shift 2
  # shellcheck disable=SC2086
  timeout "$TIMEOUT" qemu-system-x86_64 $ACC -m "$MEM" -smp "$SMP" -no-reboot \
    -nodefaults -display none -monitor none -serial stdio -kernel "$KERNEL" -initrd "$RUN/initrd.cpio" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 tsc=reliable $extra" "$@" </dev/null 2>&1 | tr -d '\r' > "$logf"
}
show() { # guest console, minus kernel noise when quiet
  if [ "${SOFTROCE_QUIET:-0}" = 1 ]; then sed -n '/^SR: >>> guest command/,/^SR: <<< guest command/p' "$1"; else cat "$1"; fi; }
TB=$(ts); rc=0
case $MODE in
single)
  log "booting 1 VM (accel=$ACCEL, smp=$SMP)"
  qemu "$RUN/vm.log" "sr.role=single sr.ip=10.0.2.15" \
       -netdev user,id=n0,restrict=on -device virtio-net-pci,netdev=n0,romfile= || rc=$?
  show "$RUN/vm.log"; LOGS="$RUN/vm.log" ;;
pair)
  PORT=${PORT:-$((20000 + RANDOM % 20000))}
  log "booting 2 VMs (accel=$ACCEL, smp=$SMP each) linked by UDP 127.0.0.1:$PORT<->$((PORT+1))"
  qemu "$RUN/vm-server.log" "sr.role=server sr.ip=10.0.0.1 sr.peer=10.0.0.2" \
       -netdev socket,id=n0,udp=127.0.0.1:$((PORT+1)),localaddr=127.0.0.1:$PORT \
       -device virtio-net-pci,netdev=n0,romfile=,mac=52:54:00:00:00:01 &
  SPID=$!
  qemu "$RUN/vm-client.log" "sr.role=client sr.ip=10.0.0.2 sr.peer=10.0.0.1" \
       -netdev socket,id=n0,udp=127.0.0.1:$PORT,localaddr=127.0.0.1:$((PORT+1)) \
       -device virtio-net-pci,netdev=n0,romfile=,mac=52:54:00:00:00:02 || rc=$?
  wait $SPID || rc=$?
  echo "===== server VM ====="; show "$RUN/vm-server.log"
  echo "===== client VM ====="; show "$RUN/vm-client.log"
  LOGS="$RUN/vm-server.log $RUN/vm-client.log" ;;
esac
ok=1
for l in $LOGS; do
  r=$(sed -n 's/^SR: RESULT rc=\([0-9]*\).*/\1/p' "$l" | tail -1)
  log "$(basename "$l" .log): $(grep -m1 -o 'rxe0 ready at [0-9.]*s' "$l" || echo 'rxe0 NOT ready'), command rc=${r:-none (timeout or crash)}"
  [ "${r:-1}" = 0 ] || ok=0
done
log "VM wall time $(el "$TB")s (qemu rc=$rc); total $(el "$T0")s"
if [ $ok = 1 ]; then log PASS; exit 0; else log FAIL; exit 1; fi
