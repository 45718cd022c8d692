#!/usr/bin/env bash
# The open CUDA deadlock of README "Known limits" (an application thread creating streams
# while async ops hold streams), in one device call: the lock probe in its variants, then
# the tests about it (the default configuration, the engine's path, and each kind of op copied
# on its stream), each in a process of its own under each variant that
# may matter: the default; copies into the application's memory without the bounce
# through the engine's scratch (HIPFILE_CUDA_MIN_COPY_BYTES=0); CUDA's default 8 hardware
# queues instead of the 32 hipfile-rs sets (CUDA_DEVICE_MAX_CONNECTIONS=8). Run with
# target/gpu-bundle built (tests/gpu/make-bundle.sh); a line per result on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
tests/gpu/cuda-lock-probe.sh 2>&1 | grep -E "^===|creator|probe: .*(WAITS|app )|after the gate|^exit"
tests=(streams::streams_made_while_ops_hold_streams
       streams::streams_made_while_engine_path_ops_hold_streams
       streams::streams_made_while_engine_path_writes_hold_streams
       streams::streams_made_while_reads_copied_on_their_streams_hold_streams
       streams::streams_made_while_reads_copied_from_device_slots_hold_streams
       streams::streams_made_while_writes_copied_into_slots_hold_streams
       streams::streams_made_while_writes_in_pieces_hold_streams
       streams::streams_made_while_long_ops_copied_in_pieces_hold_streams
       streams::streams_made_while_unfixed_long_ops_copied_in_pieces_hold_streams
       streams::streams_made_while_unfixed_ops_copied_on_their_streams_hold_streams)
for variant in "HIPFILE_LOCK_CHECK=default" "HIPFILE_CUDA_MIN_COPY_BYTES=0" "CUDA_DEVICE_MAX_CONNECTIONS=8"; do
  for test in "${tests[@]}"; do
    env "$variant" HIPFILE_DEVICE=cuda timeout -s KILL 50 target/gpu-bundle/tests/async_api \
      --test-threads=1 --exact "$test" >/tmp/hf-lock-check.log 2>&1
    rc=$?
    case $rc in 0) verdict=PASS;; 137) verdict=HANG;; *) verdict="FAIL ($rc)";; esac
    echo "$verdict $test [$variant]"
    [ "$rc" = 0 ] || grep -E "HANG:|stream 0x|async:" /tmp/hf-lock-check.log | head -4
  done
done
