# Sourced by device scripts that compare this tree with a baseline: where build/base_src holds a
# baseline tree (`git archive BASE | tar -x -C build/base_src`, carried), it is copied to /tmp/base
# (outside the carried paths a later call's tree replaces) and built there in the background;
# base_wait waits for it and says whether it built (/tmp/base/build/dev then holds it).
base_pid=
if [ -d build/base_src ]; then
  # (rebuilt at every call that carries it: a warm machine may still hold another call's baseline)
  rm -rf /tmp/base /tmp/base_built && cp -r build/base_src /tmp/base && mkdir -p /tmp/base/build && cp -r build/carry /tmp/base/build/carry
  ( source /tmp/base/tools/device/cuda_build.sh > /tmp/base_build.log 2>&1 && echo ok > /tmp/base_built ) &
  base_pid=$!
fi
base_wait() {
  [ -n "$base_pid" ] && wait "$base_pid"
  [ -f /tmp/base_built ] || { [ -f /tmp/base_build.log ] && tail -20 /tmp/base_build.log; return 1; }
}
