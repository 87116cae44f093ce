#!/usr/bin/env bash
# A two-host test bed on one machine: two network namespaces ("hosts" a and b) joined by
# a veth pair whose link `tc netem` shapes (delay, jitter, rate, loss), UCX over TCP
# between them, and `baton train --plan` with the first half of the ranks on host a and
# the second half on host b (one pipeline replica per host for a DP=2 plan). Needs root
# (CAP_NET_ADMIN and CAP_SYS_ADMIN). docs/development.md, "The two-host test bed".
#
#   scripts/two-hosts.sh [run] [options] [LAUNCH-OPTIONS] [-- TRAIN-ARGS...]
#       sets the hosts up, trains, tears them down on exit (also on failure or Ctrl-C)
#   scripts/two-hosts.sh up [shaping options]     prints the id of the pair it made
#   scripts/two-hosts.sh shape --id K [shaping options]
#   scripts/two-hosts.sh cut --id K [--how down|loss]
#   scripts/two-hosts.sh restore --id K
#   scripts/two-hosts.sh launch --id K -n N [--hosts LIST] [LAUNCH-OPTIONS] -- CMD [ARGS...]
#       --hosts: each rank's host, a letter per rank ("abab": ranks 0 and 2 on host a);
#       default the first half on a, the second on b (then N must be even)
#   scripts/two-hosts.sh down --id K
#
# Options of run:
#   --layout dp|pp|dp-pp   dp (default): DP=2, one rank per host; pp: PP=2, one stage per
#                          host; dp-pp: DP=2 x PP=2, one two-stage replica per host
#   --plan FILE            a plan of one's own instead (an even number of devices)
#   --model FILE           for --layout (default examples/models/tiny-gpt.json)
#   --data FILE            (default examples/data/licenses.txt)
#   --steps N              (default 20)
#   --baton PATH           the command (default $BATON, else build/release/baton)
#   --peer-timeout S       BATON_PEER_TIMEOUT of the ranks (default 4)
# Shaping (each direction; none given: the link is not shaped):
#   --delay MS  --jitter MS  --rate RATE (tc's units: 1gbit, 100mbit)  --loss PERCENT
# Anything else before `--` goes to `baton launch` (--max-restarts N, --grace S, ...).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state_root=/run/baton-two-hosts

die() {
  echo "two-hosts.sh: $*" >&2
  exit 2
}

ns_a() { echo "baton$1a"; }
ns_b() { echo "baton$1b"; }
dev_a() { echo "btv$1a"; }
dev_b() { echo "btv$1b"; }
addr_a() { echo "10.233.$1.1"; }
addr_b() { echo "10.233.$1.2"; }

# The netem arguments of the shaping options, empty when none is given.
netem_args() {
  local delay="$1" jitter="$2" rate="$3" loss="$4" a=""
  if [[ -n "$delay" || -n "$jitter" ]]; then
    a="delay ${delay:-0}ms"
    [[ -n "$jitter" ]] && a+=" ${jitter}ms"
  fi
  [[ -n "$rate" ]] && a+=" rate $rate"
  [[ -n "$loss" ]] && a+=" loss ${loss}%"
  echo "$a"
}

link_kind() { cat "$state_root/$1.link" 2>/dev/null || echo veth; }

# Applies netem arguments to both ends (egress of each: the delay is each way): with tc
# on a veth pair, or through the emulator's shape file on a TUN pair.
apply_shape() {
  local id="$1" args="$2"
  echo "$args" >"$state_root/$id.active"
  if [[ "$(link_kind "$id")" == tun ]]; then
    kill -HUP "$(cat "$state_root/$id.pid")"
    return 0
  fi
  for side in a b; do
    local ns dev
    ns="$(ns_$side "$id")"
    dev="$(dev_$side "$id")"
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
    if [[ -n "$args" ]]; then
      # shellcheck disable=SC2086
      tc -n "$ns" qdisc add dev "$dev" root netem $args || return 1
    fi
  done
}

# The link between the namespaces: a veth pair shaped by tc netem where the kernel has
# netem, else (CONFIG_NET_SCH_NETEM off, as on some VMs' kernels) two TUN devices with
# scripts/link-emulator.py between them (the same shaping, in user space).
# $TWO_HOSTS_LINK=veth|tun forces one.
make_link() {
  local id="$1" kind="${TWO_HOSTS_LINK:-auto}"
  if [[ "$kind" != tun ]]; then
    ip link add "$(dev_a "$id")" type veth peer name "$(dev_b "$id")" || return 1
    ip link set "$(dev_a "$id")" netns "$(ns_a "$id")" || return 1
    ip link set "$(dev_b "$id")" netns "$(ns_b "$id")" || return 1
    if [[ "$kind" == veth ]] ||
      tc -n "$(ns_a "$id")" qdisc add dev "$(dev_a "$id")" root netem delay 0ms 2>/dev/null; then
      tc -n "$(ns_a "$id")" qdisc del dev "$(dev_a "$id")" root 2>/dev/null || true
      echo veth >"$state_root/$id.link"
      ip -n "$(ns_a "$id")" addr add "$(addr_a "$id")/24" dev "$(dev_a "$id")" || return 1
      ip -n "$(ns_b "$id")" addr add "$(addr_b "$id")/24" dev "$(dev_b "$id")" || return 1
      return 0
    fi
    ip -n "$(ns_a "$id")" link del "$(dev_a "$id")"
  fi
  if [[ ! -c /dev/net/tun ]]; then
    echo "two-hosts.sh: the kernel has no netem and there is no /dev/net/tun: cannot shape a link" >&2
    return 3
  fi
  echo tun >"$state_root/$id.link"
  : >"$state_root/$id.active"
  setsid chrt -f 10 /usr/bin/python3 "$repo/scripts/link-emulator.py" "$(dev_a "$id")" "$(dev_b "$id")" \
    "$state_root/$id.active" "$id" >"$state_root/$id.log" 2>&1 </dev/null &
  echo $! >"$state_root/$id.pid"
  for _ in $(seq 1 100); do
    grep -q ready "$state_root/$id.log" 2>/dev/null && break
    kill -0 "$(cat "$state_root/$id.pid")" 2>/dev/null || break
    sleep 0.05
  done
  grep -q ready "$state_root/$id.log" || {
    cat "$state_root/$id.log" >&2
    return 1
  }
  ip link set "$(dev_a "$id")" netns "$(ns_a "$id")" || return 1
  ip link set "$(dev_b "$id")" netns "$(ns_b "$id")" || return 1
  ip -n "$(ns_a "$id")" addr add "$(addr_a "$id")" peer "$(addr_b "$id")" dev "$(dev_a "$id")" ||
    return 1
  ip -n "$(ns_b "$id")" addr add "$(addr_b "$id")" peer "$(addr_a "$id")" dev "$(dev_b "$id")"
}

# Makes a pair with the first free id (claimed atomically by creating namespace a).
up() {
  local args="$1" id=""
  # Exit code 3: this machine cannot have network namespaces (tests skip on it).
  if [[ $(id -u) != 0 ]]; then
    echo "two-hosts.sh: needs root (network namespaces, veth or TUN, tc)" >&2
    exit 3
  fi
  mkdir -p "$state_root"
  local why=""
  for k in $(seq 1 250); do
    [[ -e "/run/netns/$(ns_a "$k")" ]] && continue
    if why="$(ip netns add "$(ns_a "$k")" 2>&1)"; then
      id="$k"
      break
    fi
    [[ -e "/run/netns/$(ns_a "$k")" ]] && continue  # taken by another at the same moment
    echo "two-hosts.sh: cannot create a network namespace here: $why" >&2
    exit 3
  done
  [[ -n "$id" ]] || die "no free id (namespaces baton1a to baton250a all exist: ip netns list)"
  local code=0
  ip netns add "$(ns_b "$id")" && make_link "$id" || code=$?
  if [[ $code == 3 ]]; then
    down "$id"
    exit 3
  fi
  if [[ $code != 0 ]] ||
    ! ip -n "$(ns_a "$id")" link set lo up || ! ip -n "$(ns_b "$id")" link set lo up ||
    ! ip -n "$(ns_a "$id")" link set "$(dev_a "$id")" up ||
    ! ip -n "$(ns_b "$id")" link set "$(dev_b "$id")" up ||
    ! echo "$args" >"$state_root/$id.shape" || ! apply_shape "$id" "$args"; then
    down "$id"
    die "could not set up the pair $id"
  fi
  echo "$id"
}

down() {
  local id="$1"
  if [[ -f "$state_root/$id.pid" ]]; then
    kill "$(cat "$state_root/$id.pid")" 2>/dev/null || true
  fi
  # Deleting a namespace deletes its end of the veth pair, and with it the other end.
  ip netns del "$(ns_a "$id")" 2>/dev/null || true
  ip netns del "$(ns_b "$id")" 2>/dev/null || true
  rm -f "$state_root/$id".{shape,active,link,pid,log}
}

cut() {
  local id="$1" how="$2"
  case "$how" in
    down) ip -n "$(ns_a "$id")" link set "$(dev_a "$id")" down ;;
    loss) apply_shape "$id" "loss 100%" ;;
    *) die "cut --how: expected down or loss, got '$how'" ;;
  esac
}

restore() {
  local id="$1"
  ip -n "$(ns_a "$id")" link set "$(dev_a "$id")" up
  apply_shape "$id" "$(cat "$state_root/$id.shape" 2>/dev/null || true)"
}

# baton launch inside host a, its rendezvous on a's address; each rank enters its host
# (the first half a, the rest b) by `ip netns exec`, which execs in place, so the
# launcher's pid is the rank's (its stop and exit are seen as ever). UCX_TLS=tcp: the
# namespaces share the machine's memory, and shared-memory transports would bypass the
# link.
launch() {
  local id="$1" baton="$2" n="$3" hosts="$4"
  shift 4
  local launch_opts=() cmd=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do
    launch_opts+=("$1")
    shift
  done
  [[ $# -gt 0 ]] || die "launch: no command after --"
  shift
  cmd=("$@")
  if [[ -z "$hosts" ]]; then
    (( n >= 2 && n % 2 == 0 )) || die "the job needs an even number of ranks, got $n"
    hosts="$(printf 'a%.0s' $(seq 1 $((n / 2))))$(printf 'b%.0s' $(seq 1 $((n / 2))))"
  fi
  [[ "$hosts" =~ ^[ab]+$ && ${#hosts} == "$n" ]] ||
    die "--hosts: expected a letter a or b for each of the $n ranks, got '$hosts'"
  # shellcheck disable=SC2016
  local enter='h=$(printf %s '"$hosts"' | cut -c$((BATON_RANK + 1))); if [ "$h" = a ]; then ns='"$(ns_a "$id")"' dev='"$(dev_a "$id")"'; else ns='"$(ns_b "$id")"' dev='"$(dev_b "$id")"'; fi; exec ip netns exec "$ns" env UCX_TLS=tcp UCX_NET_DEVICES="$dev" "$@"'
  ip netns exec "$(ns_a "$id")" "$baton" launch -n "$n" --rendezvous "$(addr_a "$id"):0" \
    ${launch_opts[@]+"${launch_opts[@]}"} -- sh -c "$enter" rank "${cmd[@]}"
}

# The plan of a layout, written into $2.
write_plan() {
  local layout="$1" file="$2" model="$3" parallel stages n
  case "$layout" in
    dp)
      parallel='{"dp": 2, "pp": 1, "tp": 1}'
      stages='[{"layers": ["embed", "h.0", "h.1", "head"]}]'
      n=2
      ;;
    pp)
      parallel='{"dp": 1, "pp": 2, "tp": 1}'
      stages='[{"layers": ["embed", "h.0"]}, {"layers": ["h.1", "head"]}]'
      n=2
      ;;
    dp-pp)
      parallel='{"dp": 2, "pp": 2, "tp": 1}'
      stages='[{"layers": ["embed", "h.0"]}, {"layers": ["h.1", "head"]}]'
      n=4
      ;;
    *) die "--layout: expected dp, pp or dp-pp, got '$layout'" ;;
  esac
  cat >"$file" <<EOF
{
  "version": 1,
  "model": "$model",
  "devices": $n,
  "parallel": $parallel,
  "batch": {"micro_batch_size": 2},
  "schedule": {"name": "1f1b", "micro_batches": 4},
  "stages": $stages
}
EOF
}

main() {
  local mode=run
  case "${1:-}" in
    run | up | shape | cut | restore | launch | down)
      mode="$1"
      shift
      ;;
  esac
  local id="" how=down delay="" jitter="" rate="" loss="" layout=dp plan="" n="" hosts=""
  local model="$repo/examples/models/tiny-gpt.json" data="$repo/examples/data/licenses.txt"
  local steps=20 baton="${BATON:-$repo/build/release/baton}" peer_timeout=4
  local rest=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --id) id="$2"; shift 2 ;;
      --how) how="$2"; shift 2 ;;
      --delay) delay="$2"; shift 2 ;;
      --jitter) jitter="$2"; shift 2 ;;
      --rate) rate="$2"; shift 2 ;;
      --loss) loss="$2"; shift 2 ;;
      --layout) layout="$2"; shift 2 ;;
      --plan) plan="$2"; shift 2 ;;
      --model) model="$(realpath "$2")"; shift 2 ;;
      --data) data="$(realpath "$2")"; shift 2 ;;
      --steps) steps="$2"; shift 2 ;;
      --baton) baton="$(realpath "$2")"; shift 2 ;;
      --peer-timeout) peer_timeout="$2"; shift 2 ;;
      -n) n="$2"; shift 2 ;;
      --hosts) hosts="$2"; shift 2 ;;
      -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
      *)
        rest=("$@")
        break
        ;;
    esac
  done
  local shape
  shape="$(netem_args "$delay" "$jitter" "$rate" "$loss")"
  [[ "$mode" == run || "$mode" == up || -n "$id" ]] || die "$mode: --id K is needed"
  case "$mode" in
    up) up "$shape" ;;
    down) down "$id" ;;
    shape)
      echo "$shape" >"$state_root/$id.shape"
      apply_shape "$id" "$shape"
      ;;
    cut) cut "$id" "$how" ;;
    restore) restore "$id" ;;
    launch)
      [[ -n "$n" ]] || die "launch: -n N is needed"
      launch "$id" "$baton" "$n" "$hosts" ${rest[@]+"${rest[@]}"}
      ;;
    run)
      [[ -x "$baton" ]] || die "no baton command at $baton (build it, or --baton PATH)"
      local tmp launch_opts=() train_args=()
      tmp="$(mktemp -d /tmp/baton-two-hosts.XXXXXX)"
      id="$(up "$shape")" || exit $?
      # shellcheck disable=SC2064
      trap "down $id; rm -rf '$tmp'" EXIT
      trap 'exit 130' INT TERM
      if [[ -z "$plan" ]]; then
        plan="$tmp/plan.json"
        write_plan "$layout" "$plan" "$model"
      fi
      n="$(grep -o '"devices"[[:space:]]*:[[:space:]]*[0-9]*' "$plan" | grep -o '[0-9]*$')"
      [[ -n "$n" ]] || die "$plan: no \"devices\" field"
      local seen_dash=0
      for a in ${rest[@]+"${rest[@]}"}; do
        if [[ $seen_dash == 0 && "$a" == "--" ]]; then
          seen_dash=1
        elif [[ $seen_dash == 0 ]]; then
          launch_opts+=("$a")
        else
          train_args+=("$a")
        fi
      done
      echo "two-hosts.sh: hosts $(ns_a "$id") ($(addr_a "$id")) and $(ns_b "$id")" \
        "($(addr_b "$id")), link: ${shape:-not shaped}; $n ranks, $((n / 2)) per host" >&2
      BATON_PEER_TIMEOUT="${BATON_PEER_TIMEOUT:-$peer_timeout}" launch "$id" "$baton" "$n" \
        "$hosts" ${launch_opts[@]+"${launch_opts[@]}"} -- "$baton" train --plan "$plan" --data "$data" \
        --steps "$steps" ${train_args[@]+"${train_args[@]}"}
      ;;
  esac
}

main "$@"
